package io.dstltree.spark;

import java.io.IOException;
import java.io.OutputStream;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;

/**
 * A state file on its way to the bridge. Bytes are buffered up to one chunk ({@link
 * BridgeClient#MAX_PAYLOAD}, 8 MiB); each full chunk goes out as a {@code put} with {@code
 * "last": false}, and {@link #close()} sends the rest with {@code "last": true} and waits for
 * the bridge to accept the file. {@link #cancel()} drops the connection: the bridge writes
 * nothing. A file that fits in one chunk is only sent at close, so when no bridge answers
 * then, it is written as a plain file through the manager's fallback instead. A write or close
 * on an interrupted thread (Spark cancelling the task) throws {@link
 * java.io.InterruptedIOException} and writes nothing anywhere: a cancelled attempt leaves no
 * plain file.
 */
final class BridgeOutputStream extends CancellableFSDataOutputStream {
  /** Where a file goes when no bridge answers at close: a plain file of these bytes. */
  interface Fallback {
    void write(byte[] bytes, int length, BridgeException why) throws IOException;
  }

  private final Chunks chunks;

  /**
   * A file {@code path} of query {@code root} for the bridge on {@code socket}; {@code
   * accepted} runs once the bridge accepted the whole file, {@code fallback} when no bridge
   * answered at close.
   */
  BridgeOutputStream(
      String socket,
      String root,
      String path,
      long timeoutMillis,
      Runnable accepted,
      Fallback fallback) {
    this(new Chunks(socket, root, path, timeoutMillis, accepted, fallback));
  }

  private BridgeOutputStream(Chunks chunks) {
    super(chunks);
    this.chunks = chunks;
  }

  @Override
  public void cancel() {
    chunks.cancel();
  }

  /** The bytes of one file, sent to the bridge in chunks. */
  private static final class Chunks extends OutputStream {
    private final String socket;
    private final String root;
    private final String path;
    private final long timeoutMillis;
    private final Runnable accepted;
    private final Fallback fallback;
    private byte[] buf = new byte[64 << 10];
    private int len;
    private long sent;
    private BridgeClient client;
    private boolean done;

    Chunks(
        String socket,
        String root,
        String path,
        long timeoutMillis,
        Runnable accepted,
        Fallback fallback) {
      this.socket = socket;
      this.root = root;
      this.path = path;
      this.timeoutMillis = timeoutMillis;
      this.accepted = accepted;
      this.fallback = fallback;
    }

    @Override
    public void write(int b) throws IOException {
      write(new byte[] {(byte) b}, 0, 1);
    }

    @Override
    public void write(byte[] b, int off, int n) throws IOException {
      if (done) {
        throw new IOException("write after close or cancel: " + path);
      }
      while (n > 0) {
        if (len == BridgeClient.MAX_PAYLOAD) {
          put(false);
        }
        if (len == buf.length) {
          byte[] bigger = new byte[Math.min(BridgeClient.MAX_PAYLOAD, buf.length * 2)];
          System.arraycopy(buf, 0, bigger, 0, len);
          buf = bigger;
        }
        int k = Math.min(n, buf.length - len);
        System.arraycopy(b, off, buf, len, k);
        len += k;
        off += k;
        n -= k;
      }
    }

    private void put(boolean last) throws IOException {
      if (client == null) {
        client = BridgeClient.connect(socket, timeoutMillis);
      }
      var header =
          BridgeClient.JSON
              .createObjectNode()
              .put("op", "put")
              .put("root", root)
              .put("path", path)
              .put("offset", sent)
              .put("last", last);
      if (last) {
        client.call(header, java.util.Arrays.copyOf(buf, len), timeoutMillis);
        client.release();
        client = null;
        accepted.run();
      } else {
        client.send(header, buf, len);
      }
      sent += len;
      len = 0;
    }

    @Override
    public void close() throws IOException {
      if (done) {
        return;
      }
      done = true;
      try {
        put(true);
      } catch (BridgeException e) {
        if (sent == 0 && e.unavailable()) {
          fallback.write(buf, len, e);
        } else {
          throw e;
        }
      }
    }

    void cancel() {
      done = true;
      if (client != null) {
        client.close();
        client = null;
      }
    }
  }
}
