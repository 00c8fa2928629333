"""The deployment recipes of docs/deploy.md: the Kubernetes manifests under deploy/k8s
(a node DaemonSet on the host network, the topology ConfigMap, the driver and the
executor pod template) and the standalone files under deploy/standalone agree with each
other and with the project's topology schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from dstltree.topology.config import parse_topology

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
STANDALONE = ROOT / "deploy" / "standalone"


# Settings every job needs, whatever the cluster manager (docs/deploy.md, "Spark settings").
JOB_SETTINGS = {
    "spark.task.maxFailures": "1",
    "spark.stage.maxConsecutiveAttempts": "1",
    "spark.dynamicAllocation.enabled": "false",
    "spark.executorEnv.PYSPARK_PYTHON": "/opt/dstltree/bin/python",
    "spark.pyspark.python": "/opt/dstltree/bin/python",
}


def _documents() -> list[tuple[Path, dict[str, Any]]]:
    """Every YAML document under deploy/k8s with its file, in file order."""
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict), f"{path}: a document is not a mapping"
            docs.append((path, doc))
    return docs


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for _, d in _documents()
        if d.get("kind") == kind and (name is None or d.get("metadata", {}).get("name") == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _conf(path: Path) -> dict[str, str]:
    """A spark-defaults.conf as a mapping; rejects trailing comments (Spark keeps them
    as part of the value)."""
    settings = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        value = value.strip()
        assert "#" not in value, f"{path}: trailing comment in {line!r}"
        assert key not in settings, f"{path}: {key} set twice"
        settings[key] = value
    return settings


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _container(pod_spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec["containers"]
    if name is None:
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def _topology_text() -> str:
    return _one("ConfigMap", "dstl-topology")["data"]["topology.yaml"]


def _k8s_topology() -> dict[str, Any]:
    doc = yaml.safe_load(_topology_text())
    assert isinstance(doc, dict)
    return doc


def _node_port() -> int:
    """The port every node of the Kubernetes topology binds (one port for all)."""
    ports = {int(n["bind"].rsplit(":", 1)[1]) for n in _k8s_topology()["nodes"]}
    assert len(ports) == 1, f"nodes bind different ports: {ports}"
    return ports.pop()


def _images() -> set[str]:
    """The images of the pods and DaemonSets (the executor template has none: Spark
    fills in spark.kubernetes.container.image)."""
    images = set()
    for _, doc in _documents():
        if doc["kind"] in ("Pod", "DaemonSet"):
            pod = doc["spec"]["template"] if doc["kind"] == "DaemonSet" else doc
            images |= {c["image"] for c in pod["spec"]["containers"] if "image" in c}
    return images


def _host_ip_ref(env: dict[str, Any]) -> str | None:
    return env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")


def test_every_manifest_loads_and_names_its_kind() -> None:
    docs = _documents()
    assert {p.name for p, _ in docs} >= {
        "00-namespace.yaml",
        "10-topology-configmap.yaml",
        "20-node-daemonset.yaml",
        "30-driver.yaml",
        "executor-pod-template.yaml",
    }
    for path, doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: apiVersion and kind"
        if path.parent == K8S and doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "dstl", f"{path}: {doc['kind']} namespace"


def test_daemonset_runs_one_node_per_host_on_the_host_network() -> None:
    ds = _one("DaemonSet", "dstl-node")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    node = _container(spec, "dstl-node")
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    volume = next(v for v in spec["volumes"] if v["name"] == "topology")
    assert volume["configMap"]["name"] == "dstl-topology"
    assert "topology.yaml" in _one("ConfigMap", "dstl-topology")["data"]
    mounted = f"{mounts['topology']}/topology.yaml"
    command = node["command"] + node.get("args", [])
    assert command == ["dstl", "node", "--topology", mounted, "--node-id", "$(HOST_IP)"]
    assert _host_ip_ref(_env(node)["HOST_IP"]) == "status.hostIP"
    port = _node_port()
    assert {(p["containerPort"], p["hostPort"]) for p in node["ports"]} == {(port, port)}
    assert node["readinessProbe"]["tcpSocket"]["port"] == port


def test_topology_nodes_are_the_hosts_at_the_node_port() -> None:
    """Node ids are host IPs (what the DaemonSet passes as --node-id), every node binds
    all interfaces at the node port and advertises its host at that port."""
    port = _node_port()
    nodes = _k8s_topology()["nodes"]
    for n in nodes:
        assert n["id"] == n["host"], n
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", n["host"]), n
        assert n["bind"] == f"tcp://0.0.0.0:{port}"
        assert n["advertise"] == f"tcp://{n['host']}:{port}"
    assert sum(1 for n in nodes if "parent" not in n) == 1


def test_k8s_topology_passes_the_schema() -> None:
    topo = parse_topology(yaml.safe_load(_topology_text()), source="dstl-topology")
    port = _node_port()
    hosts = [n["host"] for n in _k8s_topology()["nodes"]]
    assert topo.host_nodes() == {h: f"tcp://{h}:{port}" for h in hosts}
    assert topo.node_for_host(hosts[1]) == hosts[1]  # node ids are the host IPs
    assert topo.node_for_host("192.0.2.1") is None
    assert len(topo.tree()) == len(hosts)


def test_executor_template_points_tasks_at_the_node_of_their_host() -> None:
    template = yaml.safe_load((K8S / "spark" / "executor-pod-template.yaml").read_text())
    conf = _conf(K8S / "spark" / "spark-defaults.conf")
    container = _container(
        template["spec"], conf["spark.kubernetes.executor.podTemplateContainerName"]
    )
    env = container["env"]
    names = [e["name"] for e in env]
    assert names.index("HOST_IP") < names.index("DSTL_NODE")  # $(HOST_IP) is expanded
    assert _host_ip_ref(_env(container)["HOST_IP"]) == "status.hostIP"
    assert _env(container)["DSTL_NODE"]["value"] == f"tcp://$(HOST_IP):{_node_port()}"
    ds_spec = _one("DaemonSet", "dstl-node")["spec"]["template"]["spec"]
    assert template["spec"]["nodeSelector"] == ds_spec["nodeSelector"]


def test_k8s_spark_settings_and_driver_pod_agree() -> None:
    conf = _conf(K8S / "spark" / "spark-defaults.conf")
    assert JOB_SETTINGS.items() <= conf.items()
    assert "spark.executorEnv.DSTL_NODE" not in conf  # would override the per-host value
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.kubernetes.namespace"] == "dstl"
    assert conf["spark.master"].startswith("k8s://")
    driver = _one("Pod", "dstl-driver")
    assert conf["spark.kubernetes.driver.pod.name"] == "dstl-driver"
    spec = driver["spec"]
    container = _container(spec)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
    assert volumes == {"topology": "dstl-topology", "spark-conf": "dstl-spark"}
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets == {"keys": "dstl-keys"}  # the CURVE cluster keys
    assert _env(container)["SPARK_CONF_DIR"]["value"] == mounts["spark-conf"]
    template_path = conf["spark.kubernetes.executor.podTemplateFile"]
    assert template_path == f"{mounts['spark-conf']}/executor-pod-template.yaml"
    assert _host_ip_ref(_env(container)["SPARK_LOCAL_IP"]) == "status.podIP"
    assert spec["serviceAccountName"] == _one("ServiceAccount")["metadata"]["name"]
    binding = _one("RoleBinding")
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]
    service = _one("Service", "dstl-driver")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= driver["metadata"]["labels"].items()
    ports = {p["port"] for p in service["spec"]["ports"]}
    assert ports == {int(conf["spark.driver.port"]), int(conf["spark.blockManager.port"])}
    assert _images() == {conf["spark.kubernetes.container.image"]}


def _standalone_topology() -> dict[str, Any]:
    doc = yaml.safe_load((STANDALONE / "topology.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_standalone_topology_lists_hosts() -> None:
    doc = _standalone_topology()
    hosts = doc["hosts"]
    assert len(hosts) == len(set(hosts)) >= 2
    assert isinstance(doc["node_port"], int) and isinstance(doc["branching"], int)
    assert "nodes" not in doc


def test_standalone_topology_passes_the_schema() -> None:
    doc = _standalone_topology()
    topo = parse_topology(doc, source="deploy/standalone/topology.yaml")
    port = doc["node_port"]
    assert topo.host_nodes() == {h: f"tcp://{h}:{port}" for h in doc["hosts"]}
    assert topo.node_for_host(doc["hosts"][1]) == "n1"
    tree = topo.tree()
    assert tree.root == "n0" and len(tree) == len(doc["hosts"])


def test_standalone_spark_settings() -> None:
    conf = _conf(STANDALONE / "spark-defaults.conf")
    assert JOB_SETTINGS.items() <= conf.items()
    assert conf["spark.master"].startswith("spark://") and conf["spark.master"].endswith(":7077")
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.driver.host"] and conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert "spark.executorEnv.DSTL_NODE" not in conf  # one value for all hosts: by host


def test_systemd_unit_runs_the_node_named_by_its_instance() -> None:
    unit = (STANDALONE / "dstl-node@.service").read_text()
    exec_start = next(
        line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart=")
    )
    assert exec_start.split() == [
        "/opt/dstltree/bin/dstl",
        "node",
        "--topology",
        "/etc/dstl/topology.yaml",
        "--node-id",
        "%i",
    ]
    python = _conf(STANDALONE / "spark-defaults.conf")["spark.executorEnv.PYSPARK_PYTHON"]
    assert Path(exec_start.split()[0]).parent == Path(python).parent
    assert "KillSignal=SIGTERM" in unit and "Restart=on-failure" in unit
