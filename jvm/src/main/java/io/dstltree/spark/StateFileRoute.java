package io.dstltree.spark;

import io.dstltree.spark.StateFiles.StateFile;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.UnaryOperator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The state-file side of {@link DstlFileSystem} and {@link DstlLocalFileSystem}: RocksDB's
 * state store copies its snapshot SST files with {@code FileSystem.copyFromLocalFile} and
 * {@code copyToLocalFile} (and may read zip files with {@code open}), past any checkpoint file
 * manager. A state file (as {@link DstlCheckpointFileManager} defines it) goes to the bridge
 * and is read from it; when no bridge answers, or it does not hold the file, the wrapped file
 * system's plain file is used, as the manager does.
 */
final class StateFileRoute {
  /** A plain-file operation of the wrapped file system. */
  interface Plain<T> {
    T run() throws IOException;
  }

  /** A plain-file operation without a result. */
  interface PlainCopy {
    void run() throws IOException;
  }

  private static final Logger LOG = LoggerFactory.getLogger(StateFileRoute.class);
  private final String socket;
  private final long timeoutMillis;
  private final UnaryOperator<Path> qualify;
  private final AtomicBoolean warned = new AtomicBoolean();

  StateFileRoute(Configuration conf, UnaryOperator<Path> qualify) {
    this.socket = StateFiles.socket(conf);
    this.timeoutMillis =
        (long) (conf.getDouble(DstlCheckpointFileManager.TIMEOUT_KEY, 60.0) * 1000);
    this.qualify = qualify;
  }

  private StateFile state(Path p) {
    return StateFiles.parse(qualify.apply(p).toString());
  }

  private String socket(StateFile f) {
    return StateFiles.socketFor(f, socket);
  }

  private void noBridge(BridgeException why, StateFile f) {
    if (warned.compareAndSet(false, true)) {
      LOG.warn(
          "dstltree: no bridge answers ({}); state files copied through the file system are"
              + " plain files (first: {}/{}; this warning once per file system)",
          why.getMessage(),
          f.root(),
          f.path());
    }
  }

  private static File local(Path p) {
    return new File(p.toUri().getPath());
  }

  /** {@code copyFromLocalFile}: a state file {@code dst} goes to the bridge. */
  void copyFromLocal(boolean delSrc, Path src, Path dst, PlainCopy plain) throws IOException {
    StateFile f = state(dst);
    if (f == null || !put(f, Files.readAllBytes(local(src).toPath()))) {
      plain.run();
      return;
    }
    if (delSrc && !local(src).delete()) {
      throw new IOException("cannot delete " + src + " after copying it to " + dst);
    }
  }

  /** Whether the bridge accepted the file (false: none answered, write it plain). */
  private boolean put(StateFile f, byte[] bytes) throws IOException {
    boolean[] plain = {false};
    BridgeOutputStream out =
        new BridgeOutputStream(
            socket(f),
            f.root(),
            f.path(),
            timeoutMillis,
            () -> {
              DstlCheckpointFileManager.pending(f.root());
              StateFileMetrics.INSTANCE.bridge.incrementAndGet();
            },
            (b, n, why) -> {
              noBridge(why, f);
              plain[0] = true;
            });
    try {
      out.write(bytes);
      out.close();
    } catch (IOException e) {
      out.cancel(); // the bridge writes nothing of an unfinished file
      if (!(e instanceof BridgeException b) || !b.unavailable()) {
        throw e; // an interrupt (InterruptedIOException) too: a cancel, not a missing bridge
      }
      noBridge(b, f);
      StateFileMetrics.INSTANCE.plain.incrementAndGet();
      return false;
    }
    if (plain[0]) {
      StateFileMetrics.INSTANCE.plain.incrementAndGet();
    }
    return !plain[0];
  }

  /** The file's bytes from the bridge, null when it does not hold it or none answers. */
  private byte[] read(StateFile f) throws IOException {
    try {
      return StateFiles.read(socket(f), f, timeoutMillis);
    } catch (BridgeException e) {
      if (!e.unavailable()) {
        throw e;
      }
      noBridge(e, f);
      return null;
    }
  }

  /** {@code copyToLocalFile}: a state file the bridge holds is written to {@code dst}. */
  void copyToLocal(boolean delSrc, Path src, Path dst, PlainCopy plain) throws IOException {
    StateFile f = state(src);
    byte[] bytes = f == null ? null : read(f);
    if (bytes == null) {
      plain.run();
      return;
    }
    File out = local(dst);
    File parent = out.getParentFile();
    if (parent != null && !parent.isDirectory() && !parent.mkdirs() && !parent.isDirectory()) {
      throw new IOException("cannot create " + parent);
    }
    Files.write(out.toPath(), bytes);
    if (delSrc) {
      delete(src, () -> false);
    }
  }

  /** {@code open}: a state file the bridge holds is read from memory. */
  FSDataInputStream open(Path p, Plain<FSDataInputStream> plain) throws IOException {
    StateFile f = state(p);
    byte[] bytes = f == null ? null : read(f);
    return bytes == null ? plain.run() : new FSDataInputStream(new BytesInputStream(bytes));
  }

  /** {@code getFileStatus}: a state file the bridge holds is a file of its length. */
  FileStatus status(Path p, Plain<FileStatus> plain) throws IOException {
    StateFile f = state(p);
    long length = -1;
    if (f != null) {
      try {
        length = StateFiles.length(socket(f), f, timeoutMillis);
      } catch (BridgeException e) {
        if (!e.unavailable()) {
          throw e;
        }
        noBridge(e, f);
      }
    }
    if (length < 0) {
      return plain.run();
    }
    return new FileStatus(length, false, 1, 1, System.currentTimeMillis(), qualify.apply(p));
  }

  /** {@code delete}: a state file goes from the bridge and as a plain file. */
  boolean delete(Path p, Plain<Boolean> plain) throws IOException {
    StateFile f = state(p);
    boolean gone = false;
    if (f != null) {
      try {
        BridgeClient c = BridgeClient.connect(socket(f), timeoutMillis);
        gone =
            c.call(StateFiles.request("delete", f).put("path", f.path()), null, timeoutMillis)
                .header()
                .path("deleted")
                .asBoolean(false);
        c.release();
      } catch (BridgeException e) {
        if (!e.unavailable() && !"not-found".equals(e.code())) {
          throw e;
        }
      }
    }
    try {
      return plain.run() || gone;
    } catch (FileNotFoundException e) {
      if (gone) {
        return true;
      }
      throw e;
    }
  }
}
