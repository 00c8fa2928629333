package io.dstltree.spark;

import io.dstltree.spark.StateFiles.StateFile;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * A checkpoint location that lives in the tree alone: {@code dstl://<query>/} ({@code
 * spark.hadoop.fs.dstl.impl=io.dstltree.spark.DstlTreeFileSystem}, set by {@code
 * dstltree.structured_streaming.configure}). Every file below {@code dstl://<query>} is a file
 * of the query root {@code dstl://<query>} on this host's bridge (protocol 2), whose nodes
 * write the objects to the tree's DFS (through fsspec: s3fs for S3), so a PySpark install
 * without any Hadoop S3 connector checkpoints to S3.
 *
 * <p>Directories are implicit: a path is a directory when the bridge holds a file below it
 * (the root always is one); {@code mkdirs} creates nothing and succeeds, {@code listStatus} of
 * a directory with nothing below it is empty. A file is written whole at {@code close} (one
 * bridge request per 8 MiB chunk); {@code append} is refused; {@code rename} of a file is a
 * read, a write and a delete (not atomic: Spark's checkpoint file manager for this scheme,
 * {@link DstlCheckpointFileManager}, never renames). With no bridge every request fails
 * ({@link BridgeException}, code {@code unavailable}): there are no plain files to fall back
 * to.
 */
public class DstlTreeFileSystem extends FileSystem {
  private URI uri;
  private String socket;
  private long timeoutMillis;
  private Path workingDir;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    if (name.getAuthority() == null || name.getAuthority().isEmpty()) {
      throw new IOException(
          "dstltree: a dstl:// location names its query, dstl://<query>/, got " + name);
    }
    uri = URI.create(StateFiles.TREE_SCHEME + "://" + name.getAuthority());
    socket = StateFiles.socket(conf);
    timeoutMillis = (long) (conf.getDouble(DstlCheckpointFileManager.TIMEOUT_KEY, 60.0) * 1000);
    workingDir = new Path(uri.toString() + "/");
    setConf(conf);
  }

  @Override
  public String getScheme() {
    return StateFiles.TREE_SCHEME;
  }

  @Override
  public URI getUri() {
    return uri;
  }

  private StateFile file(Path p) throws IOException {
    Path q = makeQualified(p);
    StateFile f = StateFiles.parseAny(q.toString());
    if (f == null || !f.tree()) {
      throw new IOException("dstltree: not a path of " + uri + ": " + p);
    }
    return f;
  }

  private String socket(StateFile f) {
    return StateFiles.socketFor(f, socket);
  }

  @Override
  public FSDataInputStream open(Path p, int bufferSize) throws IOException {
    byte[] bytes = StateFiles.read(socket(file(p)), file(p), timeoutMillis);
    if (bytes == null) {
      throw new FileNotFoundException(p.toString());
    }
    return new FSDataInputStream(new BytesInputStream(bytes));
  }

  @Override
  public FSDataOutputStream create(
      Path p,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    StateFile f = file(p);
    if (f.path().isEmpty()) {
      throw new IOException("dstltree: " + p + " is the location itself, not a file");
    }
    if (!overwrite && StateFiles.length(socket(f), f, timeoutMillis) >= 0) {
      throw new FileAlreadyExistsException(p.toString());
    }
    return new BridgeOutputStream(
        socket(f),
        f.root(),
        f.path(),
        timeoutMillis,
        () -> StateFileMetrics.INSTANCE.bridge.incrementAndGet(),
        (bytes, length, why) -> {
          throw why; // no plain files here
        });
  }

  @Override
  public FSDataOutputStream append(Path p, int bufferSize, Progressable progress)
      throws IOException {
    throw new IOException("dstltree: a dstl:// file is written whole, not appended: " + p);
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    StateFile from = file(src);
    byte[] bytes = StateFiles.read(socket(from), from, timeoutMillis);
    if (bytes == null || exists(dst)) {
      return false;
    }
    try (FSDataOutputStream out = create(dst, false)) {
      out.write(bytes);
    }
    return delete(src, false);
  }

  @Override
  public boolean delete(Path p, boolean recursive) throws IOException {
    StateFile f = file(p);
    if (StateFiles.length(socket(f), f, timeoutMillis) >= 0) {
      return deleteFile(f);
    }
    FileStatus[] children = listStatus(p);
    if (children.length == 0) {
      return false; // nothing there (directories are implicit)
    }
    if (!recursive) {
      throw new IOException("dstltree: " + p + " is a directory that is not empty");
    }
    for (FileStatus c : children) {
      delete(c.getPath(), true);
    }
    return true;
  }

  private boolean deleteFile(StateFile f) throws IOException {
    BridgeClient c = BridgeClient.connect(socket(f), timeoutMillis);
    boolean gone =
        c.call(StateFiles.request("delete", f).put("path", f.path()), null, timeoutMillis)
            .header()
            .path("deleted")
            .asBoolean(false);
    c.release();
    return gone;
  }

  @Override
  public FileStatus[] listStatus(Path p) throws IOException {
    StateFile f = file(p);
    long length = StateFiles.length(socket(f), f, timeoutMillis);
    Path q = makeQualified(p);
    if (length >= 0) {
      return new FileStatus[] {fileStatus(q, length)};
    }
    return StateFiles.list(socket(f), f, q, timeoutMillis);
  }

  private static FileStatus fileStatus(Path q, long length) {
    return new FileStatus(length, false, 1, 1, System.currentTimeMillis(), q);
  }

  @Override
  public void setWorkingDirectory(Path dir) {
    workingDir = makeQualified(dir);
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDir;
  }

  @Override
  public boolean mkdirs(Path p, FsPermission permission) throws IOException {
    file(p); // a path of this location
    return true;
  }

  @Override
  public FileStatus getFileStatus(Path p) throws IOException {
    StateFile f = file(p);
    Path q = makeQualified(p);
    long length = StateFiles.length(socket(f), f, timeoutMillis);
    if (length >= 0) {
      return fileStatus(q, length);
    }
    if (f.path().isEmpty() || StateFiles.list(socket(f), f, q, timeoutMillis).length > 0) {
      return new FileStatus(0, true, 1, 1, System.currentTimeMillis(), q);
    }
    throw new FileNotFoundException(p.toString());
  }
}
