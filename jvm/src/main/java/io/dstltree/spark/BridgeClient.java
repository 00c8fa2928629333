package io.dstltree.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedByInterruptException;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * One connection to the bridge over a Unix domain socket (protocol versions 1 and 2, see
 * docs/structured-streaming.md; {@link #version()} is the one its hello agreed). Frames: u32 header length (big-endian), UTF-8 JSON header,
 * u32 payload length, payload. Idle connections are kept in a small pool per socket path and
 * Spark application (its hello named it), so a request costs no new connection; a connection
 * that saw any error is closed, never reused.
 * Every wait for a reply is bounded: the connection is closed when its deadline passes.
 *
 * <p>An interrupted thread (Spark cancelling its task, or stopping a query) gets {@link
 * InterruptedIOException}, never code {@code unavailable}: a cancel is not a missing bridge,
 * so no caller falls back to plain files for it (see {@link #interrupted}).
 */
final class BridgeClient implements AutoCloseable {
  static final int MAX_PAYLOAD = 8 << 20;
  static final int MAX_HEADER = 64 << 10;
  static final ObjectMapper JSON = new ObjectMapper();

  private static final int POOL_SIZE = 8;
  private static final Map<String, ConcurrentLinkedDeque<BridgeClient>> POOLS =
      new ConcurrentHashMap<>();
  private static final ScheduledExecutorService WATCHDOG =
      Executors.newSingleThreadScheduledExecutor(
          r -> {
            Thread t = new Thread(r, "dstltree-bridge-deadlines");
            t.setDaemon(true);
            return t;
          });

  /** A reply: its JSON header and its payload (empty for most replies). */
  record Reply(JsonNode header, byte[] payload) {}

  private final String socket;
  private final SocketChannel channel;
  /** The pool this connection returns to: its socket and the application its hello named. */
  private final String poolKey;
  /** The protocol version the hello agreed (1: state files only). */
  private int version = 1;

  private BridgeClient(String socket, SocketChannel channel, String poolKey) {
    this.socket = socket;
    this.channel = channel;
    this.poolKey = poolKey;
  }

  /**
   * An idle pooled connection to {@code socket}, or a new one after its {@code hello}.
   *
   * @throws BridgeException code {@code unavailable} when the socket is missing or refuses
   * @throws InterruptedIOException when this thread is interrupted (no pooled connection is
   *     touched then: an interrupted channel operation would close it)
   */
  static BridgeClient connect(String socket, long timeoutMillis) throws IOException {
    if (Thread.currentThread().isInterrupted()) {
      throw interrupted(socket, null);
    }
    String app = applicationId(); // a JVM that outlives a session names the next one
    String key = socket + "\n" + app;
    ConcurrentLinkedDeque<BridgeClient> pool = POOLS.get(key);
    if (pool == null) {
      pool = POOLS.computeIfAbsent(key, s -> new ConcurrentLinkedDeque<>());
      closeIdleOfOtherApplications(socket, key);
    }
    for (BridgeClient idle = pool.poll(); idle != null; idle = pool.poll()) {
      if (idle.alive()) {
        return idle;
      }
      idle.close(); // the bridge closed it (restarted, or gone)
    }
    SocketChannel ch;
    try {
      ch = SocketChannel.open(StandardProtocolFamily.UNIX);
    } catch (IOException e) {
      throw interruptedOr(
          socket, e, new BridgeException("unavailable", "cannot open a Unix domain socket", e));
    }
    try {
      ch.connect(UnixDomainSocketAddress.of(socket));
    } catch (IOException e) {
      closeQuietly(ch);
      throw interruptedOr(
          socket, e, new BridgeException("unavailable", "no bridge on " + socket + ": " + e, e));
    }
    BridgeClient c = new BridgeClient(socket, ch, key);
    ObjectNode hello = JSON.createObjectNode().put("op", "hello").put("app", app);
    hello.putArray("versions").add(1).add(2);
    // this JVM's fallbacks so far, shown by dstl status (a new connection follows an outage)
    hello.put("plain", StateFileMetrics.INSTANCE.plain.get()).put("jvm", JVM);
    c.version = c.call(hello, null, timeoutMillis).header().path("version").asInt(1);
    return c;
  }

  /** This JVM as {@code <pid>@<host>}, at most 256 characters, for the hello. */
  private static final String JVM = jvmName();

  private static String jvmName() {
    String name = java.lang.management.ManagementFactory.getRuntimeMXBean().getName();
    name = name.replaceAll("[^\\x20-\\x7e]", "_");
    return name.length() > 256 ? name.substring(0, 256) : name;
  }

  /** The protocol version this connection's hello agreed: 2 serves a whole location. */
  int version() {
    return version;
  }


  /**
   * The exception for a request cut short because this thread was interrupted: {@link
   * InterruptedIOException} naming the bridge, its cause {@code e} (null when the request was
   * not begun). The thread's interrupt flag stays set (a {@link ClosedByInterruptException}
   * leaves it set; it is set again in case a library cleared it), so Spark sees the cancel.
   */
  static InterruptedIOException interrupted(String socket, IOException e) {
    Thread.currentThread().interrupt();
    InterruptedIOException x =
        new InterruptedIOException("bridge " + socket + ": request interrupted (task cancelled)");
    x.initCause(e);
    return x;
  }

  /**
   * {@code unavailable}, unless {@code e} came from an interrupt ({@link
   * ClosedByInterruptException}, or any failure while this thread is interrupted): then {@link
   * #interrupted}.
   */
  private IOException interruptedOr(IOException e, BridgeException unavailable) {
    return interruptedOr(socket, e, unavailable);
  }

  private static IOException interruptedOr(
      String socket, IOException e, BridgeException unavailable) {
    if (e instanceof ClosedByInterruptException || Thread.currentThread().isInterrupted()) {
      return interrupted(socket, e);
    }
    return unavailable;
  }

  /** The application this JVM served last ({@link #applicationId}). */
  private static volatile String lastApplication = "";

  /**
   * This JVM's Spark application ({@code spark.app.id}), "" outside one. The bridge holds
   * the state files of an application whose driver commits on the same host until that
   * commit, and makes the others' durable before it answers their close. While a session
   * stops, {@code SparkEnv} is cleared before Spark's state store maintenance has uploaded
   * its last snapshots: those files still belong to the application this JVM served last,
   * and are held with its other files (one object at the bridge's next flush, not one per
   * file).
   */
  static String applicationId() {
    org.apache.spark.SparkEnv env = org.apache.spark.SparkEnv.get();
    if (env == null) {
      return lastApplication;
    }
    String id = env.conf().get("spark.app.id", "");
    id = id.length() > 256 ? id.substring(0, 256) : id;
    if (!id.isEmpty()) {
      lastApplication = id;
    }
    return id;
  }

  /** Idle connections to {@code socket} of earlier applications: each holds a bridge thread. */
  private static void closeIdleOfOtherApplications(String socket, String keep) {
    for (Map.Entry<String, ConcurrentLinkedDeque<BridgeClient>> e : POOLS.entrySet()) {
      if (e.getKey().startsWith(socket + "\n") && !e.getKey().equals(keep)) {
        for (BridgeClient idle = e.getValue().poll(); idle != null; idle = e.getValue().poll()) {
          idle.close();
        }
        POOLS.remove(e.getKey(), e.getValue());
      }
    }
  }

  /** True unless the bridge closed this idle connection (a read would see its end). */
  private boolean alive() {
    try {
      channel.configureBlocking(false);
      int n = channel.read(ByteBuffer.allocate(1));
      channel.configureBlocking(true);
      return n == 0; // -1: closed; > 0: a byte nobody asked for, out of step
    } catch (IOException e) {
      return false;
    }
  }

  /** Returns this connection to its pool (after a complete request and reply). */
  void release() {
    ConcurrentLinkedDeque<BridgeClient> pool = POOLS.get(poolKey);
    if (pool == null || !channel.isOpen() || pool.size() >= POOL_SIZE) {
      close();
    } else {
      pool.push(this);
    }
  }

  /**
   * Sends one request and waits at most {@code timeoutMillis} for its reply.
   *
   * @throws BridgeException with the reply's code when it says {@code "ok": false} (the
   *     connection is closed), or code {@code unavailable} when the connection broke or the
   *     deadline passed
   * @throws InterruptedIOException when this thread was interrupted (the connection is closed)
   */
  Reply call(ObjectNode header, byte[] payload, long timeoutMillis) throws IOException {
    ScheduledFuture<?> deadline =
        WATCHDOG.schedule(this::close, timeoutMillis, TimeUnit.MILLISECONDS);
    try {
      send(header, payload, payload == null ? 0 : payload.length);
      return receive();
    } catch (BridgeException e) {
      close();
      throw e.unavailable() ? interruptedOr(e, e) : e; // "unavailable" when cancelled: a cancel
    } catch (InterruptedIOException e) {
      close();
      throw e;
    } catch (IOException e) {
      close();
      String why = deadline.isDone() ? "no reply within " + timeoutMillis + " ms" : e.toString();
      BridgeException unavailable =
          new BridgeException("unavailable", "bridge " + socket + ": " + why, e);
      throw interruptedOr(e, unavailable);
    } finally {
      deadline.cancel(false);
    }
  }

  /**
   * Sends one frame that gets no reply (a {@code put} with {@code "last": false}).
   *
   * @throws InterruptedIOException when this thread was interrupted (the connection is closed)
   */
  void send(ObjectNode header, byte[] payload, int length) throws IOException {
    try {
      byte[] h = JSON.writeValueAsBytes(header);
      ByteBuffer head = ByteBuffer.allocate(4 + h.length + 4);
      head.putInt(h.length).put(h).putInt(length).flip();
      ByteBuffer body = ByteBuffer.wrap(payload == null ? new byte[0] : payload, 0, length);
      while (head.hasRemaining() || body.hasRemaining()) {
        channel.write(new ByteBuffer[] {head, body});
      }
    } catch (IOException e) {
      close();
      BridgeException unavailable =
          new BridgeException("unavailable", "bridge " + socket + ": " + e, e);
      throw interruptedOr(e, unavailable);
    }
  }

  private Reply receive() throws IOException {
    byte[] h = readBlock(MAX_HEADER);
    JsonNode header = JSON.readTree(new String(h, StandardCharsets.UTF_8));
    byte[] payload = readBlock(MAX_PAYLOAD);
    if (!header.path("ok").asBoolean(false)) {
      throw new BridgeException(
          header.path("code").asText("internal"),
          "bridge " + socket + ": " + header.path("error").asText("error without a message"),
          null);
    }
    return new Reply(header, payload);
  }

  private byte[] readBlock(int max) throws IOException {
    ByteBuffer len = readFully(ByteBuffer.allocate(4));
    int n = len.getInt(0);
    if (n < 0 || n > max) {
      throw new BridgeException("malformed", "bridge " + socket + ": frame of " + n, null);
    }
    return readFully(ByteBuffer.allocate(n)).array();
  }

  private ByteBuffer readFully(ByteBuffer buf) throws IOException {
    while (buf.hasRemaining()) {
      if (channel.read(buf) < 0) {
        throw new IOException("connection closed by the bridge");
      }
    }
    return buf;
  }

  @Override
  public void close() {
    closeQuietly(channel);
  }

  private static void closeQuietly(SocketChannel ch) {
    try {
      ch.close();
    } catch (IOException ignored) {
      // closing a broken connection: nothing left to do
    }
  }
}
