package io.dstltree.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;

/**
 * What the checkpoint file manager and the file systems share: which paths are state files,
 * which bridge holds a query root's files, and whole-file reads from a bridge.
 */
final class StateFiles {
  /** {@code <root>/state/<operator>/<partition>[/<rest>]}, the root as long as possible. */
  private static final Pattern STATE = Pattern.compile("^(.+)/(state/\\d+/\\d+(?:/.*)?)$");

  /**
   * The bridge socket of each query root whose state directory a manager was made for in this
   * JVM: a cached file system made under another session's configuration still finds the
   * bridge of the session that writes the root now.
   */
  private static final Map<String, String> ROOT_SOCKETS = new ConcurrentHashMap<>();

  /** The environment variable naming this host's bridge socket (wins over the setting). */
  static final String SOCKET_ENV = "DSTLTREE_BRIDGE_SOCKET";

  private StateFiles() {}

  /**
   * The files of a checkpoint location beside its state files (protocol 2): the offsets,
   * commits and sources logs (and their directories), the query's {@code metadata}, the
   * state operators' metadata and schema files, and the {@code state} directories listed.
   */
  private static final Pattern LOCATION =
      Pattern.compile(
          "^(.+?)/("
              + "state/\\d+/(?:\\d+/)?_[^/]+(?:/.*)?"
              + "|(?:offsets|commits)(?:/\\d+)?"
              + "|sources(?:/\\d+(?:/\\d+(?:\\.compact)?)?)?"
              + "|metadata|state(?:/\\d+)?"
              + ")/?$");

  /** The scheme of a location that is the tree's alone ({@link DstlTreeFileSystem}). */
  static final String TREE_SCHEME = "dstl";

  /** A path split into its query root URI and its path below the root ("" the root). */
  record StateFile(String root, String path) {
    /** Whether the bridge must speak protocol 2 for it (anything but a state file). */
    boolean whole() {
      return !STATE.matcher(root + "/" + path).matches() || path.contains("/_");
    }

    /** Whether the location is the tree's alone: there are no plain files. */
    boolean tree() {
      return root.startsWith(TREE_SCHEME + "://");
    }
  }

  /**
   * The state file a qualified path names, or null when it is not below a state directory, or
   * is Spark's own metadata below a partition ({@code _metadata/schema}: a component starting
   * with {@code _}).
   */
  static StateFile parse(String qualified) {
    Matcher m = STATE.matcher(qualified);
    if (!m.matches() || m.group(2).contains("/_")) {
      return null;
    }
    return new StateFile(m.group(1), m.group(2));
  }

  /**
   * Any file of a checkpoint location the bridge may serve (protocol 2): a state file as
   * {@link #parse}, a file or directory {@link #LOCATION} names, or any path of a {@code
   * dstl://<query>} location (its root {@code dstl://<query>}); null otherwise.
   *
   * <p>Decision: the root of a {@code file:} or other Hadoop location is found by the first
   * component Spark names (shortest root), so a location folder named {@code state} or {@code
   * offsets} inside a checkpoint's path is not taken for one; a checkpoint location nested
   * below another one's {@code offsets/} folder would be misread (Spark refuses such nesting
   * for nothing, users have no reason to).
   */
  static StateFile parseAny(String qualified) {
    if (qualified.startsWith(TREE_SCHEME + "://")) {
      String rest = qualified.substring(TREE_SCHEME.length() + 3);
      int slash = rest.indexOf('/');
      String authority = slash < 0 ? rest : rest.substring(0, slash);
      String path = slash < 0 ? "" : rest.substring(slash + 1);
      while (path.endsWith("/")) {
        path = path.substring(0, path.length() - 1);
      }
      return authority.isEmpty() ? null : new StateFile(TREE_SCHEME + "://" + authority, path);
    }
    StateFile f = parse(qualified);
    if (f != null) {
      return f;
    }
    Matcher m = LOCATION.matcher(qualified);
    return m.matches() ? new StateFile(m.group(1), m.group(2)) : null;
  }

  /**
   * The bridge socket of this JVM: {@code $DSTLTREE_BRIDGE_SOCKET} (the host's own, set where
   * the executors start, e.g. in {@code spark-env.sh}), else the Hadoop key {@value
   * DstlCheckpointFileManager#SOCKET_KEY} (also read {@code spark.hadoop.}-prefixed), else
   * {@code /tmp/dstltree-<uid>/bridge.sock}.
   */
  static String socket(org.apache.hadoop.conf.Configuration conf) {
    String host = System.getenv(SOCKET_ENV);
    if (host != null && !host.isEmpty()) {
      return host;
    }
    String key = DstlCheckpointFileManager.SOCKET_KEY;
    String otherwise = DstlCheckpointFileManager.defaultSocket();
    return conf.get(key, conf.get("spark.hadoop." + key, otherwise));
  }

  /** Remember that {@code root}'s state files go to the bridge on {@code socket}. */
  static void register(String root, String socket) {
    ROOT_SOCKETS.put(root, socket);
  }

  /** The bridge socket of {@code f}'s root, {@code otherwise} when no manager named one. */
  static String socketFor(StateFile f, String otherwise) {
    return ROOT_SOCKETS.getOrDefault(f.root(), otherwise);
  }

  static ObjectNode request(String op, StateFile f) {
    return BridgeClient.JSON.createObjectNode().put("op", op).put("root", f.root());
  }

  /**
   * The direct children of directory {@code f} ({@code dir} its Hadoop path) the bridge holds:
   * files with their length and time, directories.
   */
  static FileStatus[] list(String socket, StateFile f, Path dir, long timeoutMillis)
      throws IOException {
    BridgeClient c = BridgeClient.connect(socket, timeoutMillis);
    JsonNode r = c.call(request("list", f).put("dir", f.path()), null, timeoutMillis).header();
    c.release();
    long now = System.currentTimeMillis();
    List<FileStatus> out = new ArrayList<>();
    for (JsonNode file : r.path("files")) {
      Path child = new Path(dir, file.path("name").asText());
      long mtime = file.path("mtime").asLong(now);
      out.add(new FileStatus(file.path("length").asLong(), false, 1, 1, mtime, child));
    }
    for (JsonNode d : r.path("dirs")) {
      out.add(new FileStatus(0, true, 1, 1, now, new Path(dir, d.asText())));
    }
    return out.toArray(new FileStatus[0]);
  }

  /** The file's length in bytes from the bridge, -1 when the bridge does not hold it. */
  static long length(String socket, StateFile f, long timeoutMillis) throws IOException {
    if (f.path().isEmpty()) {
      return -1; // the root: a directory
    }
    BridgeClient c = BridgeClient.connect(socket, timeoutMillis);
    JsonNode stat = c.call(request("stat", f).put("path", f.path()), null, timeoutMillis).header();
    c.release();
    return stat.path("exists").asBoolean(false) ? stat.path("length").asLong(0) : -1;
  }

  /** The whole file from the bridge, or null when the bridge does not hold it. */
  static byte[] read(String socket, StateFile f, long timeoutMillis) throws IOException {
    if (f.path().isEmpty()) {
      return null; // the root: a directory
    }
    BridgeClient c = BridgeClient.connect(socket, timeoutMillis);
    JsonNode stat = c.call(request("stat", f).put("path", f.path()), null, timeoutMillis).header();
    if (!stat.path("exists").asBoolean(false)) {
      c.release();
      return null;
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream((int) stat.path("length").asLong(0));
    while (true) {
      ObjectNode read =
          request("read", f)
              .put("path", f.path())
              .put("offset", out.size())
              .put("length", BridgeClient.MAX_PAYLOAD);
      byte[] chunk = c.call(read, null, timeoutMillis).payload();
      if (chunk.length == 0) {
        break;
      }
      out.write(chunk, 0, chunk.length);
    }
    c.release();
    return out.toByteArray();
  }
}
