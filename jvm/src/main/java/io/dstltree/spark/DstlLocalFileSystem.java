package io.dstltree.spark;

import java.io.IOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Hadoop's local file system with the state files of query roots in the tree ({@code
 * spark.hadoop.fs.file.impl=io.dstltree.spark.DstlLocalFileSystem}, set by {@code
 * dstltree.structured_streaming.configure}): the SST files RocksDB copies past the checkpoint
 * file manager go to the bridge too ({@link StateFileRoute}). A {@link LocalFileSystem}, as
 * {@code FileSystem.getLocal} requires; every other path is served unchanged.
 */
public class DstlLocalFileSystem extends LocalFileSystem {
  private StateFileRoute route;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    route = new StateFileRoute(conf, this::makeQualified);
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
