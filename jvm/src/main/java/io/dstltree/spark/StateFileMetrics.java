package io.dstltree.spark;

import java.lang.management.ManagementFactory;
import java.util.concurrent.atomic.AtomicLong;
import javax.management.JMException;
import javax.management.ObjectName;
import org.slf4j.LoggerFactory;

/** The counters of {@link StateFileMetricsMXBean}, registered once per JVM. */
public final class StateFileMetrics implements StateFileMetricsMXBean {
  public static final String NAME = "io.dstltree.spark:type=StateFiles";
  static final StateFileMetrics INSTANCE = register(new StateFileMetrics());

  final AtomicLong plain = new AtomicLong();
  final AtomicLong bridge = new AtomicLong();
  final AtomicLong commits = new AtomicLong();
  final AtomicLong failedCommits = new AtomicLong();

  private StateFileMetrics() {}

  private static StateFileMetrics register(StateFileMetrics m) {
    try {
      ManagementFactory.getPlatformMBeanServer().registerMBean(m, new ObjectName(NAME));
    } catch (JMException | RuntimeException e) { // a second class loader: counted, not shown
      LoggerFactory.getLogger(StateFileMetrics.class).debug("{} not registered: {}", NAME, e);
    }
    return m;
  }

  /**
   * Attribute {@code name} of the registered MBean, read through the platform MBean server
   * (what a JMX client sees).
   *
   * @throws JMException when it is not registered or has no such attribute
   */
  public static long attribute(String name) throws JMException {
    Object v = ManagementFactory.getPlatformMBeanServer().getAttribute(new ObjectName(NAME), name);
    return ((Number) v).longValue();
  }

  @Override
  public long getPlainStateFiles() {
    return plain.get();
  }

  @Override
  public long getBridgeStateFiles() {
    return bridge.get();
  }

  @Override
  public long getCommits() {
    return commits.get();
  }

  @Override
  public long getFailedCommits() {
    return failedCommits.get();
  }
}
