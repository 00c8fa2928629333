package io.dstltree.spark;

import io.dstltree.spark.StateFiles.StateFile;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;

/**
 * {@code commits/<N>} on its way to the bridge: buffered, and sent with the commit request at
 * {@link #close()} ({@link DstlCheckpointFileManager#commitFile}), so that the bridge
 * persists it in the same flush as the batch's state files. {@link #cancel()} sends nothing.
 */
final class CommitOutputStream extends CancellableFSDataOutputStream {
  private final Buffer buffer;

  CommitOutputStream(
      DstlCheckpointFileManager manager, StateFile f, Path p, boolean overwriteIfPossible) {
    this(new Buffer(manager, f, p, overwriteIfPossible));
  }

  private CommitOutputStream(Buffer buffer) {
    super(buffer);
    this.buffer = buffer;
  }

  @Override
  public void cancel() {
    buffer.done = true;
  }

  /** The commit file's bytes (a few hundred bytes: a batch's commit metadata). */
  private static final class Buffer extends OutputStream {
    private final DstlCheckpointFileManager manager;
    private final StateFile file;
    private final Path path;
    private final boolean overwriteIfPossible;
    private final ByteArrayOutputStream bytes = new ByteArrayOutputStream(256);
    private boolean done;

    Buffer(DstlCheckpointFileManager manager, StateFile f, Path p, boolean overwriteIfPossible) {
      this.manager = manager;
      this.file = f;
      this.path = p;
      this.overwriteIfPossible = overwriteIfPossible;
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
      if (bytes.size() + n > BridgeClient.MAX_PAYLOAD) {
        throw new IOException("a commit file over " + BridgeClient.MAX_PAYLOAD + " bytes: " + path);
      }
      bytes.write(b, off, n);
    }

    @Override
    public void close() throws IOException {
      if (done) {
        return;
      }
      done = true;
      manager.commitFile(file, path, bytes.toByteArray(), overwriteIfPossible);
    }
  }
}
