package io.dstltree.spark;

import java.io.IOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FilterFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.util.ReflectionUtils;

/**
 * Any Hadoop file system with the state files of query roots in the tree: for a checkpoint
 * location of scheme {@code S}, set {@code spark.hadoop.fs.S.impl=io.dstltree.spark.DstlFileSystem}
 * and {@code spark.hadoop.dstltree.fs.S.impl} to the class it wraps (for example {@code
 * org.apache.hadoop.fs.s3a.S3AFileSystem}); {@code dstltree.structured_streaming.configure}
 * does both for the schemes it is given. The SST files RocksDB copies past the checkpoint file
 * manager go to the bridge too ({@link StateFileRoute}); every other path is served by the
 * wrapped file system unchanged. For {@code file:} use {@link DstlLocalFileSystem}.
 */
public class DstlFileSystem extends FilterFileSystem {
  /** {@code dstltree.fs.<scheme>.impl}: the file system class this one wraps. */
  public static final String WRAPPED_KEY = "dstltree.fs.%s.impl";

  private StateFileRoute route;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    String key = String.format(WRAPPED_KEY, name.getScheme());
    Class<?> wrapped = conf.getClass(key, null);
    if (wrapped == null || !FileSystem.class.isAssignableFrom(wrapped)) {
      throw new IOException("dstltree: set " + key + " to the file system class to wrap");
    }
    if (DstlFileSystem.class.isAssignableFrom(wrapped)) {
      throw new IOException("dstltree: " + key + " names DstlFileSystem itself");
    }
    fs = (FileSystem) ReflectionUtils.newInstance(wrapped, conf);
    fs.initialize(name, conf);
    super.initialize(name, conf);
    route = new StateFileRoute(conf, this::makeQualified);
  }

  @Override
  public String getScheme() {
    return getUri().getScheme();
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    route.copyFromLocal(delSrc, src, dst, () -> super.copyFromLocalFile(delSrc, src, dst));
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, boolean overwrite, Path src, Path dst)
      throws IOException {
    route.copyFromLocal(
        delSrc, src, dst, () -> super.copyFromLocalFile(delSrc, overwrite, src, dst));
  }

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    route.copyToLocal(delSrc, src, dst, () -> super.copyToLocalFile(delSrc, src, dst));
  }

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst, boolean useRawLocalFileSystem)
      throws IOException {
    route.copyToLocal(
        delSrc, src, dst, () -> super.copyToLocalFile(delSrc, src, dst, useRawLocalFileSystem));
  }

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    return route.open(f, () -> super.open(f, bufferSize));
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    return route.status(f, () -> super.getFileStatus(f));
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    return route.delete(f, () -> super.delete(f, recursive));
  }
}
