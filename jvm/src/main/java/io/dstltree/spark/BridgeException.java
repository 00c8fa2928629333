package io.dstltree.spark;

import java.io.IOException;

/**
 * An error from the bridge, or no bridge at all. {@link #code()} is the reply's error code
 * ({@code version}, {@code malformed}, {@code too-large}, {@code path}, {@code not-found},
 * {@code unavailable}, {@code internal}), or {@code unavailable} when the socket is missing,
 * refuses connections or the connection broke before a reply.
 */
public final class BridgeException extends IOException {
  private static final long serialVersionUID = 1L;
  private final String code;

  public BridgeException(String code, String message, Throwable cause) {
    super(message + " (" + code + ")", cause);
    this.code = code;
  }

  public String code() {
    return code;
  }

  /** True when no bridge answered: the caller writes or reads plain files instead. */
  public boolean unavailable() {
    return "unavailable".equals(code);
  }
}
