package io.dstltree.spark;

import java.io.ByteArrayInputStream;
import java.io.EOFException;
import java.io.IOException;
import org.apache.hadoop.fs.PositionedReadable;
import org.apache.hadoop.fs.Seekable;

/** A whole file read from the bridge, in memory, seekable (what FSDataInputStream needs). */
final class BytesInputStream extends ByteArrayInputStream implements Seekable, PositionedReadable {
  BytesInputStream(byte[] bytes) {
    super(bytes);
  }

  @Override
  public synchronized void seek(long pos) throws IOException {
    if (pos < 0 || pos > count) {
      throw new EOFException("seek to " + pos + " in a file of " + count + " bytes");
    }
    this.pos = (int) pos;
  }

  @Override
  public synchronized long getPos() {
    return pos;
  }

  @Override
  public boolean seekToNewSource(long targetPos) {
    return false;
  }

  @Override
  public int read(long position, byte[] b, int off, int n) {
    if (position >= count) {
      return -1;
    }
    int k = (int) Math.min(n, count - position);
    System.arraycopy(buf, (int) position, b, off, k);
    return k;
  }

  @Override
  public void readFully(long position, byte[] b, int off, int n) throws IOException {
    if (n > 0 && read(position, b, off, n) < n) {
      throw new EOFException("read of " + n + " bytes at " + position + " past the end");
    }
  }

  @Override
  public void readFully(long position, byte[] b) throws IOException {
    readFully(position, b, 0, b.length);
  }
}
