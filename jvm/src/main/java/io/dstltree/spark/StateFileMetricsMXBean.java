package io.dstltree.spark;

/**
 * This JVM's state-file counters over JMX ({@value StateFileMetrics#NAME}), for Spark's
 * {@code JmxSink} or a JMX exporter.
 */
public interface StateFileMetricsMXBean {
  /** State files written as plain files because no bridge answered. */
  long getPlainStateFiles();

  /** State files a bridge accepted. */
  long getBridgeStateFiles();

  /** Commits ({@code commits/<N>} writes) that waited for a bridge and succeeded. */
  long getCommits();

  /** Commits refused because a state file was not durable. */
  long getFailedCommits();
}
