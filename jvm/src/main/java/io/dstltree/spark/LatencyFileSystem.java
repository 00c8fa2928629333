package io.dstltree.spark;

import java.io.FilterOutputStream;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.net.URI;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FilterFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * The local file system under its own scheme (e.g. {@code fs.latency.impl}), each request
 * delayed by a latency drawn from a percentile table: Spark's own checkpoint writes then pay
 * the per-request cost of the latency model the tree's DFS writes pay under {@code
 * --dfs-faults} (Python's {@code topology/latency.py}, which also supplies the table).
 *
 * <p>Requests and their sizes: a created file's stream close = one PUT of the bytes written;
 * {@code open} = one GET of the file's length; {@code copyFromLocalFile} = one PUT of the
 * source's length; {@code copyToLocalFile} = one GET; {@code listStatus}, {@code
 * getFileStatus}, {@code delete}, {@code rename}, {@code mkdirs} = one request of size 0. The
 * delay is added before the request runs (a PUT's file appears when its delay has passed).
 *
 * <p>Hadoop keys (seconds, bytes): {@value #PERCENTILES} ({@code "50:0.459,90:0.74,..."};
 * missing: no delay, requests are only counted), {@value #REFERENCE}, {@value #BANDWIDTH}
 * (bytes/s), {@value #FLOOR}, {@value #FLOOR_FRACTION} (default 0.5), {@value #SEED}
 * (default 0). Sampling is the inverse CDF of {@code topology.latency.LatencyModel}: linear
 * between listed percentiles, from {@code floorFraction * lowest} at 0, extrapolated with
 * the last slope to 100, shifted by {@code (size - reference) / bandwidth}, at least the
 * floor. One seeded {@link Random} per instance, drawn in request order.
 */
public final class LatencyFileSystem extends FilterFileSystem {
  public static final String PERCENTILES = "dstltree.latency.percentiles";
  public static final String REFERENCE = "dstltree.latency.referenceBytes";
  public static final String BANDWIDTH = "dstltree.latency.bandwidth";
  public static final String FLOOR = "dstltree.latency.floor";
  public static final String FLOOR_FRACTION = "dstltree.latency.floorFraction";
  public static final String SEED = "dstltree.latency.seed";

  private static final Map<String, AtomicLong> REQUESTS = new ConcurrentHashMap<>();
  private static final AtomicLong DELAY_MICROS = new AtomicLong();

  private Model model;
  private Random rng;
  private String scheme;

  public LatencyFileSystem() {
    super(new Local());
  }

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    scheme = name.getScheme();
    Local local = (Local) fs;
    local.uri = URI.create(scheme + ":///");
    super.initialize(name, conf);
    local.setWorkingDirectory(new Path(scheme, null, System.getProperty("user.dir")));
    String table = conf.getTrimmed(PERCENTILES, "");
    model =
        table.isEmpty()
            ? null
            : new Model(
                table,
                conf.getLong(REFERENCE, 0),
                conf.getDouble(BANDWIDTH, Double.POSITIVE_INFINITY),
                conf.getDouble(FLOOR, 0.0),
                conf.getDouble(FLOOR_FRACTION, 0.5));
    rng = new Random(conf.getLong(SEED, 0));
  }

  @Override
  public String getScheme() {
    return scheme;
  }

  /** Requests of kind {@code op} (put, get, list, head, delete, rename, mkdirs) in this JVM. */
  public static long requests(String op) {
    AtomicLong n = REQUESTS.get(op);
    return n == null ? 0 : n.get();
  }

  /** Seconds of delay added in this JVM, all requests. */
  public static double delaySeconds() {
    return DELAY_MICROS.get() / 1e6;
  }

  /** The latency in seconds at {@code percentile} for {@code size} bytes (null model: 0). */
  public double quantile(double percentile, long size) {
    return model == null ? 0.0 : model.quantile(percentile, size);
  }

  private void request(String op, long size) throws IOException {
    REQUESTS.computeIfAbsent(op, k -> new AtomicLong()).incrementAndGet();
    if (model == null) {
      return;
    }
    double u;
    synchronized (rng) {
      u = rng.nextDouble();
    }
    long micros = (long) (model.quantile(100.0 * u, size) * 1e6);
    DELAY_MICROS.addAndGet(micros);
    try {
      Thread.sleep(micros / 1000, (int) (micros % 1000) * 1000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted during an injected " + op + " latency");
    }
  }

  @Override
  public FSDataOutputStream create(
      Path f,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    FSDataOutputStream out =
        fs.create(f, permission, overwrite, bufferSize, replication, blockSize, progress);
    return new FSDataOutputStream(new Put(out), statistics);
  }

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    request("get", fs.getFileStatus(f).getLen());
    return fs.open(f, bufferSize);
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    request("list", 0);
    return fs.listStatus(f);
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    request("head", 0);
    return fs.getFileStatus(f);
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    request("delete", 0);
    return fs.delete(f, recursive);
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    request("rename", 0);
    return fs.rename(src, dst);
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    request("mkdirs", 0);
    return fs.mkdirs(f, permission);
  }

  @Override
  public boolean mkdirs(Path f) throws IOException {
    return mkdirs(f, FsPermission.getDirDefault());
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    copyFromLocalFile(delSrc, true, src, dst);
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, boolean overwrite, Path src, Path dst)
      throws IOException {
    request("put", getLocal(getConf()).getFileStatus(src).getLen());
    fs.copyFromLocalFile(delSrc, overwrite, src, dst);
  }

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    request("get", fs.getFileStatus(src).getLen());
    fs.copyToLocalFile(delSrc, src, dst);
  }

  /** A created file's stream: its close is the PUT of every byte written. */
  private final class Put extends FilterOutputStream {
    private long written;
    private boolean closed;

    Put(OutputStream out) {
      super(out);
    }

    @Override
    public void write(int b) throws IOException {
      out.write(b);
      written++;
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
      out.write(b, off, len);
      written += len;
    }

    @Override
    public void close() throws IOException {
      if (closed) {
        return;
      }
      closed = true;
      try {
        request("put", written);
      } finally {
        out.close();
      }
    }
  }

  /** The raw local file system (no checksum files) answering to this instance's scheme. */
  static final class Local extends RawLocalFileSystem {
    private static final URI FILE = URI.create("file:///");
    URI uri; // null while RawLocalFileSystem's constructor runs

    @Override
    public URI getUri() {
      return uri == null ? FILE : uri;
    }

    @Override
    public String getScheme() {
      return getUri().getScheme();
    }
  }

  /** The inverse CDF of {@code topology.latency.LatencyModel} (seconds, bytes). */
  static final class Model {
    private final double[] xs;
    private final double[] ys;
    private final long reference;
    private final double bandwidth;
    private final double floor;

    Model(String table, long reference, double bandwidth, double floor, double floorFraction) {
      TreeMap<Double, Double> pts = new TreeMap<>();
      for (String item : table.split(",")) {
        String[] kv = item.trim().split(":");
        if (kv.length != 2) {
          throw new IllegalArgumentException(PERCENTILES + ": expected p:s pairs, got " + item);
        }
        pts.put(Double.parseDouble(kv[0]), Double.parseDouble(kv[1]));
      }
      if (pts.firstKey() <= 0 || pts.lastKey() >= 100 || !(bandwidth > 0)) {
        throw new IllegalArgumentException("percentiles in (0, 100) and a bandwidth > 0");
      }
      int n = pts.size();
      xs = new double[n + 2];
      ys = new double[n + 2];
      int i = 1;
      for (Map.Entry<Double, Double> e : pts.entrySet()) {
        xs[i] = e.getKey();
        ys[i] = e.getValue();
        if (ys[i] < ys[i - 1]) {
          throw new IllegalArgumentException(PERCENTILES + ": latencies must not decrease");
        }
        i++;
      }
      ys[0] = floorFraction * ys[1];
      double slope = n >= 2 ? (ys[n] - ys[n - 1]) / (xs[n] - xs[n - 1]) : 0.0;
      xs[n + 1] = 100.0;
      ys[n + 1] = ys[n] + slope * (100.0 - xs[n]);
      this.reference = reference;
      this.bandwidth = bandwidth;
      this.floor = floor;
    }

    double quantile(double percentile, long size) {
      int i = 1;
      while (i < xs.length - 1 && xs[i] <= percentile) {
        i++;
      }
      double x0 = xs[i - 1];
      double x1 = xs[i];
      double base = x1 > x0 ? ys[i - 1] + (ys[i] - ys[i - 1]) * (percentile - x0) / (x1 - x0) : ys[i];
      return Math.max(floor, base + (size - reference) / bandwidth);
    }
  }
}
