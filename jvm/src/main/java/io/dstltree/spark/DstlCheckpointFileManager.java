package io.dstltree.spark;

import com.fasterxml.jackson.databind.JsonNode;
import io.dstltree.spark.StateFiles.StateFile;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Spark's checkpoint file manager with state files in the dstltree tree
 * ({@code spark.sql.streaming.checkpointFileManagerClass=io.dstltree.spark.DstlCheckpointFileManager}).
 *
 * <p>A state file is a path {@code <root>/state/<operator>/<partition>/...} (none of whose
 * further components starts with {@code _}, as Spark's {@code _metadata/schema}): it goes to
 * the bridge on this host (socket from the Hadoop key {@value #SOCKET_KEY}, default {@code
 * /tmp/dstltree-<uid>/bridge.sock}); {@code open}, {@code exists} and {@code list} show the
 * bridge's files merged with plain files (the bridge's copy wins), {@code delete} removes
 * both. Every other path goes to Spark's default manager. Before the driver writes {@code
 * <root>/commits/<N>}, the bridge must confirm that every state file it accepted for {@code
 * <root>} is durable, else the write fails (and with it the batch).
 *
 * <p>When no bridge answers, a state file is written as a plain file through the default
 * manager (logged once per manager at WARN, counted in {@link #plainStateFiles()} and over JMX,
 * {@link StateFileMetricsMXBean}), so a query
 * never fails because of the tree, and reads find plain files as before. An interrupted
 * thread (Spark cancelling a task) is not a missing bridge: its request throws {@link
 * java.io.InterruptedIOException}, with no plain file, no warning and nothing counted.
 *
 * <p>The driver announces a root ({@code drive}) when it writes {@code <root>/offsets/<N>}
 * and on its first read of {@code <root>/offsets} per manager ({@link #driverReads}).
 */
public final class DstlCheckpointFileManager implements CheckpointFileManager {
  public static final String SOCKET_KEY = "dstltree.bridge.socket";
  /** Seconds the driver waits at a commit for the state files to become durable. */
  public static final String COMMIT_TIMEOUT_KEY = "dstltree.bridge.commitTimeout";
  /** Seconds any other request waits for its reply. */
  public static final String TIMEOUT_KEY = "dstltree.bridge.timeout";

  private static final Logger LOG = LoggerFactory.getLogger(DstlCheckpointFileManager.class);
  /** {@code <root>/commits/<batch id>}. */
  private static final Pattern COMMIT = Pattern.compile("^(.+)/commits/\\d+$");
  /** {@code <root>/offsets/<batch id>}: the driver is about to run a batch. */
  private static final Pattern OFFSETS = Pattern.compile("^(.+)/offsets/\\d+$");
  /** {@code <root>/offsets} or {@code <root>/offsets/<batch id>}: only a driver reads these. */
  private static final Pattern OFFSETS_LOG = Pattern.compile("^(.+)/offsets(?:/\\d+)?/?$");
  /** Roots whose batches this driver announced ({@code drive}): the bridge process's boot id. */
  private static final Map<String, String> DRIVEN = new ConcurrentHashMap<>();
  /** Roots with files accepted by a bridge in this JVM since their last commit. */
  private static final Set<String> PENDING_ROOTS = ConcurrentHashMap.newKeySet();

  private final CheckpointFileManager plain;
  private final Configuration conf;
  private final String socket;
  private final long timeoutMillis;
  private final long commitTimeoutSeconds;
  private final AtomicBoolean warned = new AtomicBoolean();
  /** Roots this manager announced on a read of their offsets log (see {@link #driverReads}). */
  private final Set<String> announced = ConcurrentHashMap.newKeySet();

  public DstlCheckpointFileManager(Path path, Configuration conf) throws IOException {
    this.conf = conf;
    this.plain = defaultManager(path, conf);
    // spark.hadoop.* set at runtime on an existing session reaches the conf unstripped
    this.socket = StateFiles.socket(conf);
    this.timeoutMillis = (long) (conf.getDouble(TIMEOUT_KEY, 60.0) * 1000);
    this.commitTimeoutSeconds = conf.getLong(COMMIT_TIMEOUT_KEY, 120);
    StateFile here = StateFiles.parseAny(qualified(path));
    if (here != null) {
      StateFiles.register(here.root(), socket);
    }
  }

  /** Note that this JVM handed a file of {@code root} to a bridge (its commit must wait). */
  static void pending(String root) {
    PENDING_ROOTS.add(root);
  }

  /** State files written as plain files in this JVM because no bridge answered. */
  public static long plainStateFiles() {
    return StateFileMetrics.INSTANCE.plain.get();
  }

  /** The bridge socket of this manager. */
  public String socket() {
    return socket;
  }

  /** Spark's own choice: FileContext where the file system supports it, else FileSystem. */
  static CheckpointFileManager defaultManager(Path path, Configuration conf) throws IOException {
    try {
      return new FileContextBasedCheckpointFileManager(path, conf);
    } catch (RuntimeException e) {
      throw e;
    } catch (Exception e) { // Scala declares no checked exceptions
      if (e instanceof UnsupportedFileSystemException) {
        return new FileSystemBasedCheckpointFileManager(path, conf);
      }
      throw e instanceof IOException io ? io : new IOException(e);
    }
  }

  static String defaultSocket() {
    String uid;
    try {
      uid = String.valueOf(new com.sun.security.auth.module.UnixSystem().getUid());
    } catch (Throwable e) { // not a Unix JVM
      uid = System.getProperty("user.name");
    }
    return "/tmp/dstltree-" + uid + "/bridge.sock";
  }

  /** The state file {@code p} names, or null when {@code p} is not below a state directory. */
  StateFile stateFile(Path p) {
    return StateFiles.parse(qualified(p));
  }

  /**
   * The file of the checkpoint location {@code p} names when the bridge serves it: a state
   * file (protocol 1), or any file of a {@code dstl://} location ({@link
   * StateFiles#parseAny}: its files are the bridge's alone, protocol 2); null: a plain file.
   *
   * <p>Decision: the logs and metadata of a location on a Hadoop file system ({@code file:},
   * {@code s3a:}, ...) stay plain files there, as before: that file system is the user's
   * choice, other tools read the logs there, and a local disk's requests cost little; a
   * location whose every request should be the tree's is {@code dstl://<query>/}.
   */
  StateFile served(Path p) {
    StateFile f = StateFiles.parseAny(qualified(p));
    return f == null || !f.whole() || f.tree() ? f : null;
  }

  private String qualified(Path p) {
    if (p.toUri().getScheme() != null) {
      return p.toString();
    }
    try {
      return p.getFileSystem(conf).makeQualified(p).toString();
    } catch (IOException e) {
      return p.toString();
    }
  }

  private static ObjectNode request(String op, StateFile f) {
    return StateFiles.request(op, f);
  }

  private BridgeClient.Reply call(ObjectNode header, long timeout) throws IOException {
    BridgeClient c = BridgeClient.connect(socket, timeout);
    BridgeClient.Reply r = c.call(header, null, timeout);
    c.release();
    return r;
  }

  private void noBridge(BridgeException why, Path p) {
    if (warned.compareAndSet(false, true)) {
      LOG.warn(
          "dstltree: no bridge answers ({}); state files are written and read as plain files"
              + " (first: {}; this warning once per manager)",
          why.getMessage(),
          p);
    }
  }

  private CancellableFSDataOutputStream ioCreateAtomic(Path p, boolean overwriteIfPossible)
      throws IOException {
    String q = qualified(p);
    Matcher o = OFFSETS.matcher(q);
    if (o.matches()) {
      drive(o.group(1));
    }
    StateFile f = served(p);
    Matcher m = COMMIT.matcher(q);
    if (m.matches() && f != null) {
      return new CommitOutputStream(this, f, p, overwriteIfPossible);
    }
    if (f == null) {
      if (m.matches()) {
        commit(m.group(1), p, null, null);
      }
      return plain.createAtomic(p, overwriteIfPossible);
    }
    return new BridgeOutputStream(
        socket,
        f.root(),
        f.path(),
        timeoutMillis,
        () -> {
          PENDING_ROOTS.add(f.root());
          StateFileMetrics.INSTANCE.bridge.incrementAndGet();
        },
        (bytes, length, why) -> {
          if (f.tree()) {
            throw why; // a dstl:// location has no plain files
          }
          noBridge(why, p);
          try (CancellableFSDataOutputStream out = plain.createAtomic(p, overwriteIfPossible)) {
            out.write(bytes, 0, length);
          }
          StateFileMetrics.INSTANCE.plain.incrementAndGet();
        });
  }

  /**
   * Closes {@code commits/<N>}: the bridge persists it with the batch's state files in one
   * flush (protocol 2). No bridge: as {@link #commit}, a plain file when nothing was handed
   * to one.
   */
  void commitFile(StateFile f, Path p, byte[] bytes, boolean overwriteIfPossible)
      throws IOException {
    if (!commit(f.root(), p, f, bytes)) {
      if (f.tree()) {
        throw new IOException("dstltree: no bridge for " + p + " (a dstl:// location)");
      }
      try (CancellableFSDataOutputStream out = plain.createAtomic(p, overwriteIfPossible)) {
        out.write(bytes);
      }
    }
  }

  /**
   * Tells the bridge that this application's driver runs {@code root}'s batches from this host,
   * so the bridge holds the batch's state files for the commit from the first batch on. Only
   * advice: without a bridge, or with one that does not know the request, nothing changes
   * (the root's boot id is forgotten then: no bridge holds this driver's next files, so its
   * commit names no process). An interrupted thread gets {@link java.io.InterruptedIOException}.
   */
  private void drive(String root) throws IOException {
    try {
      ObjectNode h = BridgeClient.JSON.createObjectNode().put("op", "drive").put("root", root);
      String boot = call(h, timeoutMillis).header().path("boot").asText("");
      if (boot.isEmpty()) {
        DRIVEN.remove(root); // a bridge without boot ids: its commit checks none
      } else {
        DRIVEN.put(root, boot); // the bridge process now holding this batch's files
      }
    } catch (BridgeException e) {
      DRIVEN.remove(root);
      LOG.debug("dstltree: drive {} not announced: {}", root, e.getMessage());
    }
  }

  /**
   * A read ({@code open}, {@code exists}, {@code list}) of {@code <root>/offsets} or {@code
   * <root>/offsets/<N>}: only a driver reads a query's offsets log, first when the query
   * starts, so it announces {@code root} ({@link #drive}) on the first such read. A query
   * restarted after its driver died reruns the uncommitted batch without writing {@code
   * offsets/<N>} again (it exists), so without this no {@code drive} would reach the bridge
   * and each of the batch's state files would become an object of its own.
   *
   * <p>Decision: once per root per manager, not per JVM. Spark makes a new manager for the
   * offsets log of every query run ({@code HDFSMetadataLog}'s own), so each start (and
   * restart in the same JVM) announces once, and later reads of the run cost nothing; each
   * batch's write of {@code offsets/<N>} announces again as before. Once per JVM would keep a
   * stale boot id ({@link #DRIVEN}) across a bridge restart: a query restarted in the same
   * JVM after the bridge restarted would send the old boot with every commit of its rerun
   * batch and fail it each time; a fresh announcement at each start takes the new boot.
   */
  private void driverReads(Path p) throws IOException {
    Matcher m = OFFSETS_LOG.matcher(qualified(p));
    if (m.matches() && announced.add(m.group(1))) {
      drive(m.group(1));
    }
  }

  /**
   * Waits until every state file the bridge accepted for {@code root} is durable; with {@code
   * file}, the bridge first accepts the commit file ({@code bytes}) and persists it in the same
   * flush (true: done; false: no bridge, write it plain). No bridge:
   * fine unless this JVM handed files of {@code root} to a bridge since the last commit, or
   * its driver announced the batch to one (it holds the batch's files: they may be lost);
   * otherwise, and when the bridge says a file is not durable or that it restarted since the
   * announcement (another process than {@code drive} reached), throws.
   */
  private boolean commit(String root, Path commitFile, StateFile file, byte[] bytes)
      throws IOException {
    ObjectNode h =
        BridgeClient.JSON
            .createObjectNode()
            .put("op", "commit")
            .put("root", root)
            .put("timeout", commitTimeoutSeconds);
    String boot = DRIVEN.get(root);
    if (boot != null) {
      h.put("boot", boot);
    }
    if (file != null) {
      h.put("path", file.path());
    }
    try {
      BridgeClient c = BridgeClient.connect(socket, timeoutMillis);
      c.call(h, bytes, (commitTimeoutSeconds + 10) * 1000);
      c.release();
      PENDING_ROOTS.remove(root);
      StateFileMetrics.INSTANCE.commits.incrementAndGet();
      return true;
    } catch (BridgeException e) {
      boolean connected = !e.getMessage().contains("no bridge on ");
      boolean handed = PENDING_ROOTS.contains(root) || boot != null;
      if (e.unavailable() && !connected && !handed) {
        noBridge(e, commitFile);
        return false;
      }
      StateFileMetrics.INSTANCE.failedCommits.incrementAndGet();
      throw new IOException(
          "dstltree: state files of " + root + " are not durable, not writing " + commitFile, e);
    }
  }

  private FSDataInputStream ioOpen(Path p) throws IOException {
    driverReads(p);
    StateFile f = served(p);
    if (f != null) {
      try {
        byte[] bytes = StateFiles.read(socket, f, timeoutMillis);
        if (bytes != null) {
          return new FSDataInputStream(new BytesInputStream(bytes));
        }
        if (f.tree()) {
          throw new FileNotFoundException(p.toString());
        }
      } catch (BridgeException e) {
        if (!e.unavailable() || f.tree()) {
          throw e;
        }
        noBridge(e, p);
      }
    }
    return plain.open(p);
  }

  private boolean ioExists(Path p) throws IOException {
    driverReads(p);
    StateFile f = served(p);
    if (f != null) {
      try {
        if (StateFiles.length(socket, f, timeoutMillis) >= 0) {
          return true;
        }
        if (f.tree()) {
          return plain.exists(p); // a directory of a dstl:// location: DstlTreeFileSystem
        }
      } catch (BridgeException e) {
        if (!e.unavailable() || f.tree()) {
          throw e;
        }
        noBridge(e, p);
      }
    }
    return plain.exists(p);
  }

  private FileStatus[] ioList(Path dir, PathFilter filter) throws IOException {
    driverReads(dir);
    StateFile f = served(dir);
    if (f == null) {
      return plain.list(dir, filter);
    }
    if (f.tree()) {
      return plain.list(dir, filter); // DstlTreeFileSystem lists the bridge's files
    }
    Map<String, FileStatus> found = new LinkedHashMap<>();
    boolean plainDir = true;
    try {
      for (FileStatus s : plain.list(dir, filter)) {
        found.put(s.getPath().getName(), s);
      }
    } catch (RuntimeException e) {
      throw e;
    } catch (Exception e) { // Scala declares none: FileNotFoundException when no such dir
      if (!(e instanceof FileNotFoundException)) {
        throw e instanceof IOException io ? io : new IOException(e);
      }
      plainDir = false;
    }
    try {
      boolean any = false;
      for (FileStatus s : StateFiles.list(socket, f, dir, timeoutMillis)) {
        any = true;
        if (filter.accept(s.getPath())) {
          if (s.isDirectory()) {
            found.putIfAbsent(s.getPath().getName(), s);
          } else {
            found.put(s.getPath().getName(), s);
          }
        }
      }
      plainDir = plainDir || any;
    } catch (BridgeException e) {
      if (!e.unavailable()) {
        throw e;
      }
      noBridge(e, dir);
    }
    if (!plainDir) {
      throw new FileNotFoundException(dir.toString());
    }
    List<FileStatus> all = new ArrayList<>(found.values());
    return all.toArray(new FileStatus[0]);
  }

  private void ioDelete(Path p) throws IOException {
    StateFile f = served(p);
    if (f != null) {
      try {
        call(request("delete", f).put("path", f.path()), timeoutMillis);
      } catch (BridgeException e) {
        if (!e.unavailable() && !"not-found".equals(e.code())) {
          throw e;
        }
        if (f.tree() && e.unavailable()) {
          throw e;
        }
      }
      if (f.tree()) {
        return;
      }
    }
    plain.delete(p);
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path p, boolean overwriteIfPossible) {
    try {
      return ioCreateAtomic(p, overwriteIfPossible);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public FSDataInputStream open(Path p) {
    try {
      return ioOpen(p);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public boolean exists(Path p) {
    try {
      return ioExists(p);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public FileStatus[] list(Path dir, PathFilter filter) {
    try {
      return ioList(dir, filter);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public void delete(Path p) {
    try {
      ioDelete(p);
    } catch (IOException e) {
      throw sneaky(e);
    }
  }

  @Override
  public void mkdirs(Path p) {
    plain.mkdirs(p);
  }

  @Override
  public boolean isLocal() {
    return plain.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    return plain.createCheckpointDirectory();
  }

  /**
   * Closes the default manager. Spark 4.1 added {@code close()} to the trait; on older lines
   * the method is not part of it (hence no {@code @Override}, and a reflective call, so the
   * same source compiles against every line: see {@code structured_streaming/jar.py}).
   */
  public void close() {
    try {
      plain.getClass().getMethod("close").invoke(plain);
    } catch (NoSuchMethodException e) {
      // a line whose managers hold nothing to close
    } catch (ReflectiveOperationException e) {
      LOG.warn("closing the default checkpoint file manager failed", e);
    }
  }

  /**
   * Throws {@code e} unchanged although the Scala trait declares no checked exceptions: Spark
   * catches {@code IOException} and {@code FileNotFoundException} from its managers by type.
   */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
    throw (E) e;
  }
}
