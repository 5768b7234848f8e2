"""Static checks of the production-shaped stack under ``docker/``.

No Docker engine is needed: the compose file, the Dockerfile, ``.env.example`` and the
Spark defaults are read as text/YAML and checked against each other, against
``pyproject.toml``, against the public configuration keys (docs/reference/config.md) and against the Hadoop
jars inside the installed PySpark. Everything here runs on the real files of the
repository, so a drifted version, a dangling path or an unknown ``spark.sparkpoint.*`` key
fails the suite.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from tests.support.paths import REPO, load_module

DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
ENV_EXAMPLE = DOCKER / ".env.example"

#: the public Spark configuration keys (docs/reference/config.md)
PUBLIC_SPARKPOINT_KEYS = frozenset(
    {
        "spark.sparkpoint.dir",
        "spark.sparkpoint.job",
        "spark.sparkpoint.workDir",
        "spark.sparkpoint.restore",
        "spark.sparkpoint.trigger",
        "spark.sparkpoint.checkpoint.interval",
        "spark.sparkpoint.checkpoint.numRetained",
        "spark.sparkpoint.checkpoint.timeout",
        "spark.sparkpoint.checkpoint.tolerableFailures",
        "spark.sparkpoint.commit.mode",
        "spark.sparkpoint.control.pollInterval",
        "spark.sparkpoint.s3.endpoint",
        "spark.sparkpoint.s3.region",
    }
)

#: Hadoop release bundled in PySpark -> the jars hadoop-aws of that release is built
#: against (hadoop-project/pom.xml: aws-java-sdk-v2.version, analytics-accelerator-s3).
#: A PySpark upgrade that moves Hadoop fails here until the new row is looked up.
HADOOP_AWS_DEPENDENCIES = {
    "3.5.0": {"AWS_SDK_BUNDLE_VERSION": "2.35.4", "ANALYTICS_ACCELERATOR_VERSION": "1.3.1"},
}

EXPECTED_SERVICES = {
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "spark-master",
    "spark-worker",
    "minio",
    "minio-init",
}

# `$$` is a literal dollar; `${NAME}`, `${NAME:-default}`, `${NAME-default}`,
# `${NAME:?error}`, `${NAME?error}` are compose interpolations.
_INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
_SPARKPOINT_KEY = re.compile(r"spark\.sparkpoint\.[A-Za-z][A-Za-z0-9_.]*")


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{COMPOSE_FILE} is not a YAML mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = compose.get("services")
    assert isinstance(svcs, dict) and svcs, f"{COMPOSE_FILE} defines no services"
    return svcs


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for number, line in enumerate(ENV_EXAMPLE.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, value = stripped.partition("=")
        assert sep, f"{ENV_EXAMPLE}:{number}: expected NAME=value, got {line!r}"
        values[name.strip()] = value.strip()
    return values


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue  # comments, also inside a continued instruction, as Docker does
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, rest = full.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    assert not pending, f"{DOCKERFILE} ends inside a continued line"
    return instructions


def dockerfile_args() -> dict[str, str]:
    args: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
    return args


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def dockerfile_runs_expanded() -> list[str]:
    """RUN commands with the ARG defaults substituted for ``${NAME}`` / ``$NAME``."""
    args = dockerfile_args()

    def expand(text: str) -> str:
        for name, value in args.items():
            text = text.replace("${" + name + "}", value)
            text = re.sub(r"\$" + name + r"\b", value, text)
        return text

    return [expand(rest) for keyword, rest in dockerfile_instructions() if keyword == "RUN"]


def interpolations(value: str) -> list[tuple[str, str, str]]:
    """(name, operator, operand) of each compose interpolation in `value`."""
    return [(m[1], m[2] or "", m[3] or "") for m in _INTERPOLATION.finditer(value) if m[1]]


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation of `value` with `env` (enough of it for this file)."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        name, operator, operand = match[1], match[2] or "", match[3] or ""
        if name in env and (env[name] or not operator.startswith(":")):
            return env[name]
        if operator.endswith("-"):
            return operand
        raise AssertionError(f"${{{name}}} is unset and has no default (compose would fail: {operand!r})")

    return _INTERPOLATION.sub(replace, value)


def walk_strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in walk_strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in walk_strings(value)]
    return []


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def bind_sources(service: dict[str, Any]) -> list[str]:
    """Host paths of the bind mounts of `service` (short and long volume syntax)."""
    sources = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/", "~")):
                sources.append(source)
        elif isinstance(volume, dict) and volume.get("type") == "bind":
            sources.append(str(volume["source"]))
    return sources


def named_volumes(service: dict[str, Any]) -> list[str]:
    names = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source = volume.split(":", 1)[0]
            if ":" in volume and not source.startswith((".", "/", "~")):
                names.append(source)
        elif isinstance(volume, dict) and volume.get("type") == "volume":
            names.append(str(volume["source"]))
    return names


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency name -> condition (``service_started`` for the list form)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def provider_connection_types(distribution: str) -> set[str]:
    """Connection types a provider declares, read from its ``get_provider_info`` module file.

    The module is loaded on its own (not through the ``airflow`` package), so Airflow is
    not initialised by this fast test.
    """
    dist = importlib.metadata.distribution(distribution)
    (entry_point,) = [ep for ep in dist.entry_points if ep.group == "apache_airflow_provider"]
    module_name, _, function = entry_point.value.partition(":")
    path = Path(str(dist.locate_file(module_name.replace(".", "/") + ".py")))
    if not path.exists():  # editable install: the module lives in the source tree
        spec = importlib.util.find_spec(module_name)
        assert spec is not None and spec.origin, f"cannot locate {module_name}"
        path = Path(spec.origin)
    module = load_module(f"_provider_info_{distribution}", path)
    info = getattr(module, function)()
    return {item["connection-type"] for item in info.get("connection-types", [])}


def pyproject_pins() -> dict[str, str]:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    return dict(re.findall(r'"(pyspark|pyspark-client)==([^"\s;]+)"', text))


def pyspark_hadoop_version() -> str:
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin, "pyspark is not importable; install the project (make setup)"
    jars = sorted((Path(spec.origin).parent / "jars").glob("hadoop-client-api-*.jar"))
    assert len(jars) == 1, f"expected one hadoop-client-api jar in the installed pyspark, found {jars}"
    return jars[0].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def image_is_pinned(image: str) -> bool:
    """True for ``name:tag`` with a versioned tag (or a ``@sha256:`` digest)."""
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return False
    tag = last.rsplit(":", 1)[1]
    return tag != "latest" and "$" not in tag and any(ch.isdigit() for ch in tag)


# --------------------------------------------------------------------------- compose


def test_compose_parses_and_has_the_stack(services: dict[str, dict[str, Any]]) -> None:
    missing = EXPECTED_SERVICES - set(services)
    assert not missing, f"compose.yaml lacks services {sorted(missing)}"
    for name, service in services.items():
        assert isinstance(service, dict), f"service {name} is not a mapping"
        assert service.get("image") or service.get("build"), f"service {name} has neither image nor build"


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        image = service.get("image")
        assert image, f"service {name} has no image: name (an unnamed build cannot be shared)"
        if service.get("build"):
            tag = image.rsplit("/", 1)[-1].partition(":")[2]
            assert tag and tag != "latest", f"service {name}: locally built image {image!r} needs a tag"
        else:
            assert image_is_pinned(image), f"service {name}: image {image!r} is not pinned to a version tag"
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            base = rest.split()[0]
            assert image_is_pinned(base), f"Dockerfile base image {base!r} is not pinned to a version tag"


def test_local_paths_exist(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    declared_volumes = set((compose.get("volumes") or {}).keys())
    for name, service in services.items():
        build = service.get("build")
        if build:
            context = DOCKER / (build if isinstance(build, str) else build.get("context", "."))
            assert context.is_dir(), f"service {name}: build context {context} does not exist"
            dockerfile = context / (
                build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
            )
            assert dockerfile.is_file(), f"service {name}: Dockerfile {dockerfile} does not exist"
        for source in bind_sources(service):
            path = (DOCKER / source).resolve()
            assert path.exists(), f"service {name}: bind-mount source {source} ({path}) does not exist"
        for volume in named_volumes(service):
            assert volume in declared_volumes, (
                f"service {name}: volume {volume!r} is not declared at top level"
            )
        env_files = service.get("env_file") or []
        for entry in [env_files] if isinstance(env_files, (str, dict)) else env_files:
            path_text = entry if isinstance(entry, str) else entry["path"]
            required = True if isinstance(entry, str) else entry.get("required", True)
            if required:
                assert (DOCKER / path_text).is_file(), f"service {name}: env_file {path_text} does not exist"


def test_dependencies_exist_and_their_conditions_hold(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for dependency, condition in depends_on(service).items():
            assert dependency in services, f"service {name} depends on unknown service {dependency!r}"
            assert dependency != name, f"service {name} depends on itself"
            target = services[dependency]
            if condition == "service_healthy":
                assert target.get("healthcheck"), (
                    f"{name} waits for {dependency} to be healthy: no healthcheck"
                )
            if condition == "service_completed_successfully":
                assert str(target.get("restart", "no")) == "no", (
                    f"{name} waits for {dependency} to complete, but {dependency} restarts"
                )


def test_long_running_services_have_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    one_shot = {
        dependency
        for service in services.values()
        for dependency, condition in depends_on(service).items()
        if condition == "service_completed_successfully"
    }
    assert {"airflow-init", "minio-init"} <= one_shot
    for name, service in services.items():
        if name in one_shot:
            continue
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), (
            f"long-running service {name} has no healthcheck"
        )


def test_airflow_runs_local_executor_on_postgres(services: dict[str, dict[str, Any]]) -> None:
    airflow_services = [n for n in services if n.startswith("airflow-")]
    assert len(airflow_services) == 5
    for name in airflow_services:
        env = environment_of(services[name])
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", name
        assert env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "").startswith("postgresql"), name
        assert "../dags:/opt/airflow/dags" in services[name]["volumes"], f"{name} does not mount ../dags"
    assert services["airflow-apiserver"]["command"] == "api-server"
    assert services["airflow-scheduler"]["command"] == "scheduler"
    assert services["airflow-dag-processor"]["command"] == "dag-processor"
    assert services["airflow-triggerer"]["command"] == "triggerer"


def test_connections_parse_and_use_the_registered_types(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> None:
    spark_types = provider_connection_types("apache-airflow-providers-apache-spark")
    sparkpoint_types = provider_connection_types("airflow-sparkpoint")
    for name in ("airflow-scheduler", "airflow-triggerer", "airflow-apiserver"):
        env = environment_of(services[name])

        spark_uri = interpolate(env["AIRFLOW_CONN_SPARK_DEFAULT"], env_example)
        parts = urlsplit(spark_uri)
        assert parts.scheme == "spark" and parts.scheme in spark_types, spark_uri
        assert (parts.hostname, parts.port) == ("spark-master", 7077), spark_uri
        assert parse_qs(parts.query).get("deploy-mode") == ["client"], spark_uri

        raw = env["AIRFLOW_CONN_SPARKPOINT_DEFAULT"]
        conn = json.loads(raw)  # valid JSON before interpolation, too
        resolved = json.loads(interpolate(raw, env_example))
        assert conn["conn_type"] == "sparkpoint" and conn["conn_type"] in sparkpoint_types, conn
        assert resolved["host"] == "s3://sparkpoint/checkpoints"
        assert resolved["login"] == env_example["SPARKPOINT_S3_ACCESS_KEY"]
        assert resolved["password"] == env_example["SPARKPOINT_S3_SECRET_KEY"]
        assert resolved["extra"] == {"endpoint_url": "http://minio:9000", "region_name": "us-east-1"}


def test_spark_workers_reach_the_master_of_the_connection(services: dict[str, dict[str, Any]]) -> None:
    master_cmd = [str(a) for a in services["spark-master"]["command"]]
    worker_cmd = [str(a) for a in services["spark-worker"]["command"]]
    assert "org.apache.spark.deploy.master.Master" in master_cmd
    assert master_cmd[master_cmd.index("--port") + 1] == "7077"
    assert "org.apache.spark.deploy.worker.Worker" in worker_cmd
    assert "spark://spark-master:7077" in worker_cmd
    scheduler_env = environment_of(services["airflow-scheduler"])
    assert scheduler_env["AIRFLOW_CONN_SPARK_DEFAULT"].startswith("spark://spark-master:7077")


def test_spark_services_use_the_image_layout(services: dict[str, dict[str, Any]]) -> None:
    env = dockerfile_env()
    spark_class = env["SPARK_HOME"] + "/bin/spark-class"
    defaults_target = env["SPARK_CONF_DIR"] + "/spark-defaults.conf"
    for name in ("spark-master", "spark-worker"):
        assert services[name]["command"][0] == spark_class, f"{name} does not start {spark_class}"
        assert services[name]["image"] == services["airflow-scheduler"]["image"], (
            f"{name} must run the Airflow image so driver and executors match"
        )
    for name in ("airflow-scheduler", "spark-master", "spark-worker"):
        targets = {v.split(":")[1]: v.split(":")[0] for v in services[name]["volumes"] if isinstance(v, str)}
        assert targets.get(defaults_target) == "./spark-conf/spark-defaults.conf", (
            f"{name} does not mount spark-defaults.conf at {defaults_target}"
        )


def test_storage_environment_for_dags_driver_and_executors(services: dict[str, dict[str, Any]]) -> None:
    for name in ("airflow-scheduler", "airflow-triggerer", "spark-worker"):
        env = environment_of(services[name])
        assert env.get("SPARKPOINT_DIR") == "s3://sparkpoint/checkpoints", name
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env.get(key, "").startswith("${SPARKPOINT_S3_"), f"{name}: {key} not from docker/.env"
    init_script = "\n".join(walk_strings(services["minio-init"]))
    assert "mc mb --ignore-existing local/sparkpoint" in init_script


#: services that run a Spark driver (Airflow tasks, LocalExecutor) or executors
DRIVERS_AND_EXECUTORS = ("airflow-scheduler", "spark-worker")


def test_the_live_location_is_one_volume_at_the_same_path_for_drivers_and_executors(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    from airflow_sparkpoint.runtime.config import require_local

    work_dirs = {name: environment_of(services[name]).get("SPARKPOINT_WORK_DIR")
                 for name in DRIVERS_AND_EXECUTORS}
    assert len(set(work_dirs.values())) == 1, f"services see different work dirs: {work_dirs}"
    work_dir = require_local(str(work_dirs["airflow-scheduler"]))  # the operator's own rule: capturable
    named_volumes = set(compose.get("volumes") or {})
    for name in DRIVERS_AND_EXECUTORS:
        mounts = []
        for entry in services[name].get("volumes") or []:
            source, _, rest = str(entry).partition(":")
            target = rest.split(":")[0]
            if (source in named_volumes
                and (work_dir == target or work_dir.startswith(target.rstrip("/") + "/"))):
                mounts.append((source, target))
        assert len(mounts) == 1, f"{name}: {work_dir} is not on exactly one named volume: {mounts}"
        work_dirs[name] = str(mounts[0])
    assert len(set(work_dirs.values())) == 1, f"the work dir is on different volumes or paths: {work_dirs}"


def test_compose_variables_come_from_env_example(
    compose: dict[str, Any], env_example: dict[str, str]
) -> None:
    used = {name for text in walk_strings(compose) for name, _, _ in interpolations(text)}
    assert used, "compose.yaml interpolates no variables; credentials must come from docker/.env"
    for text in walk_strings(compose):
        for name, operator, _ in interpolations(text):
            if not operator.endswith("-"):
                assert name in env_example, f"compose.yaml needs ${{{name}}}, missing from .env.example"
        interpolate(text, env_example)  # raises if .env.example leaves a required variable unset
    unused = set(env_example) - used
    assert not unused, f".env.example defines variables compose.yaml never uses: {sorted(unused)}"
    for name, value in env_example.items():
        assert re.fullmatch(r"[A-Za-z0-9_.-]*", value), f"{name}={value!r} is not URL/JSON-safe"
    assert len(env_example["MINIO_ROOT_PASSWORD"]) >= 8 and len(env_example["SPARKPOINT_S3_SECRET_KEY"]) >= 8


def test_no_secret_is_a_literal(services: dict[str, dict[str, Any]]) -> None:
    secret_name = re.compile(r"PASSWORD|SECRET|ACCESS_KEY|FERNET_KEY")
    checked = 0
    for name, service in services.items():
        for key, value in environment_of(service).items():
            if secret_name.search(key):
                checked += 1
                assert "${" in value, f"service {name}: {key} holds a literal; take it from docker/.env"
    assert checked, "no credential is passed to any service"
    for keyword, rest in dockerfile_instructions():
        if keyword in ("ENV", "ARG"):
            names = [item.partition("=")[0] for item in shlex.split(rest)]
            baked = [n for n in names if secret_name.search(n)]
            assert not baked, f"the Dockerfile bakes credentials into the image: {keyword} {baked}"


def test_sparkpoint_conf_keys_are_public_keys() -> None:
    found: dict[str, set[str]] = {}
    for path in sorted(DOCKER.rglob("*")):
        if path.is_file():
            for key in _SPARKPOINT_KEY.findall(path.read_text(encoding="utf-8")):
                found.setdefault(key.rstrip("."), set()).add(str(path.relative_to(REPO)))
    assert found, "no spark.sparkpoint.* key in docker/: the S3 endpoint conf is missing"
    unknown = {key: sorted(paths) for key, paths in found.items() if key not in PUBLIC_SPARKPOINT_KEYS}
    assert not unknown, f"keys that docs/reference/config.md does not list: {unknown}"
    defaults = (DOCKER / "spark-conf" / "spark-defaults.conf").read_text(encoding="utf-8")
    assert "spark.sparkpoint.s3.endpoint" in defaults


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_pins_pyspark_like_pyproject() -> None:
    pins = pyproject_pins()
    assert set(pins) == {"pyspark", "pyspark-client"}, f"pyproject.toml pins {pins}"
    assert pins["pyspark"] == pins["pyspark-client"], f"pyproject.toml pins differ: {pins}"
    runs = "\n".join(dockerfile_runs_expanded())
    for package in ("pyspark", "pyspark-client"):
        versions = re.findall(rf"\b{package}==([0-9][^\"'\s]*)", runs)
        assert versions, f"Dockerfile does not pip-install {package}==X"
        assert set(versions) == {pins[package]}, f"Dockerfile installs {package} {versions}, pyproject {pins}"


def test_dockerfile_airflow_matches_base_image_and_pyproject() -> None:
    (base,) = [rest.split()[0] for keyword, rest in dockerfile_instructions() if keyword == "FROM"]
    match = re.fullmatch(r"apache/airflow:(\d+\.\d+\.\d+)-python(3\.\d+)", base)
    assert match, f"unexpected base image {base!r}"
    assert dockerfile_args()["AIRFLOW_VERSION"] == match[1]
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    (spec,) = re.findall(r'"apache-airflow([<>=!~][^"]*)"', text)
    assert match[1] in SpecifierSet(spec), f"base image Airflow {match[1]} outside pyproject's {spec}"
    runs = "\n".join(dockerfile_runs_expanded())
    assert set(re.findall(r"apache-airflow==([^\"'\s]+)", runs)) == {match[1]}
    assert "/opt/airflow-sparkpoint" in runs, "the provider is not pip-installed from the repository"


def test_hadoop_aws_matches_the_hadoop_inside_pyspark() -> None:
    pins = pyproject_pins()
    installed = importlib.metadata.version("pyspark")
    assert installed == pins["pyspark"], f"installed pyspark {installed} is not pyproject's {pins['pyspark']}"
    hadoop = pyspark_hadoop_version()
    args = dockerfile_args()
    assert args["HADOOP_AWS_VERSION"] == hadoop, (
        f"hadoop-aws {args['HADOOP_AWS_VERSION']} but PySpark has {hadoop}"
    )
    runs = "\n".join(dockerfile_runs_expanded())
    assert f"org/apache/hadoop/hadoop-aws/{hadoop}/hadoop-aws-{hadoop}.jar" in runs
    assert hadoop in HADOOP_AWS_DEPENDENCIES, (
        f"PySpark now bundles Hadoop {hadoop}: look up aws-java-sdk-v2.version in that release's "
        "hadoop-project/pom.xml and add it to HADOOP_AWS_DEPENDENCIES"
    )
    for arg, version in HADOOP_AWS_DEPENDENCIES[hadoop].items():
        assert args[arg] == version, f"{arg}={args[arg]}, hadoop-aws {hadoop} is built with {version}"
    bundle = args["AWS_SDK_BUNDLE_VERSION"]
    assert f"software/amazon/awssdk/bundle/{bundle}/bundle-{bundle}.jar" in runs


def test_jars_are_downloaded_with_checksum_verification() -> None:
    runs = dockerfile_runs_expanded()
    (fetch,) = [run for run in runs if "fetch_jar()" in run]
    assert '"${url}.sha1"' in fetch and "sha1sum -c" in fetch, "jars are not checked against Maven's .sha1"
    assert "sha256sum -c" in fetch, "optional sha256 pins are not verified"
    jars = re.findall(r'fetch_jar "([^"]+\.jar)" "([^"]*)"', fetch)
    names = sorted(url.rsplit("/", 1)[1] for url, _ in jars)
    args = dockerfile_args()
    assert names == sorted(
        [
            f"analyticsaccelerator-s3-{args['ANALYTICS_ACCELERATOR_VERSION']}.jar",
            f"bundle-{args['AWS_SDK_BUNDLE_VERSION']}.jar",
            f"hadoop-aws-{args['HADOOP_AWS_VERSION']}.jar",
        ]
    ), names
    raw = DOCKERFILE.read_text(encoding="utf-8")
    for arg in ("HADOOP_AWS_SHA256", "AWS_SDK_BUNDLE_SHA256", "ANALYTICS_ACCELERATOR_SHA256"):
        assert arg in args and f'"${{{arg}}}"' in raw, f"{arg} is not a build arg passed to fetch_jar"


def test_java_17_and_the_build_context_filter() -> None:
    runs = "\n".join(dockerfile_runs_expanded())
    assert "openjdk-17-jre-headless" in runs
    assert dockerfile_env().get("JAVA_HOME")
    ignore = [
        line.strip()
        for line in (DOCKER / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ignore[0] == "*", "the context filter must exclude everything first (.venv, .git, ...)"
    for needed in ("!pyproject.toml", "!airflow_sparkpoint"):
        assert needed in ignore, f"Dockerfile.dockerignore drops {needed[1:]}, which pip install needs"
    if re.search(
        r'^readme\s*=\s*"README.md"', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.MULTILINE
    ):
        assert "!README.md" in ignore, "pyproject's readme is not sent to the build"
