package io.dstltree.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

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

  /** A state path split into its query root URI and its path below the root. */
  record StateFile(String root, String path) {}

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

  /** The file's length in bytes from the bridge, -1 when the bridge does not hold it. */
  static long length(String socket, StateFile f, long timeoutMillis) throws IOException {
    BridgeClient c = BridgeClient.connect(socket, timeoutMillis);
    JsonNode stat = c.call(request("stat", f).put("path", f.path()), null, timeoutMillis).header();
    c.release();
    return stat.path("exists").asBoolean(false) ? stat.path("length").asLong(0) : -1;
  }

  /** The whole file from the bridge, or null when the bridge does not hold it. */
  static byte[] read(String socket, StateFile f, long timeoutMillis) throws IOException {
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
