"""What the JVM peers (Flink SQL, Kafka Streams) need on the machine, and how they start.

``make bench`` sets both up, and goes on without either when it cannot: Flink SQL is
PyFlink in ``.venv/flink`` with the Kafka SQL connector jar in ``.venv/flink/jars``
(``bench/flink/pom.xml``); Kafka Streams is the Maven project ``bench/kstreams`` built
into its ``target/`` (the classes in a jar, the runtime jars in ``target/lib``). A peer
whose parts are missing is reported as skipped with what is missing, never dropped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

BENCH = Path(__file__).resolve().parent
KSTREAMS = BENCH / "kstreams"
KSTREAMS_JAR = KSTREAMS / "target" / "kstreams-peer-1.jar"
KSTREAMS_MAIN = "arrowagg.bench.SensorWindows"
# Beside PyFlink: bench/flink_app.py looks for it under its interpreter's prefix.
FLINK_CONNECTOR = "flink-sql-connector-kafka-*.jar"


def flink_jars(python: Path) -> Path:
    """Where ``make bench`` puts the connector for the Flink interpreter ``python``."""
    return python.parent.parent / "jars"


def missing_java() -> str | None:
    if shutil.which("java") is None:
        return "no java on PATH: Flink and Kafka Streams need Java 17+"
    return None


def kstreams_missing() -> str | None:
    """Why the Kafka Streams peer cannot run here, or None."""
    if (why := missing_java()) is not None:
        return why
    if not KSTREAMS_JAR.exists():
        how = ("mvn is not on PATH: install Maven 3.8+" if shutil.which("mvn") is None
               else "its Maven build failed (see make bench's output)")
        return f"not built: make bench builds bench/kstreams with Maven; {how}"
    return None


def flink_missing(python: Path) -> str | None:
    """Why the Flink SQL peer cannot run here, or None."""
    if (why := missing_java()) is not None:
        return why
    if not python.exists():
        return "no interpreter: make bench installs PyFlink in .venv/flink"
    if not any(flink_jars(python).glob(FLINK_CONNECTOR)):
        how = ("mvn is not on PATH: install Maven 3.8+" if shutil.which("mvn") is None
               else "Maven could not fetch it (see make bench's output)")
        return f"no Kafka SQL connector jar: make bench fetches it with Maven; {how}"
    return None


def kstreams_command(*args: str) -> list[str]:
    classpath = f"{KSTREAMS_JAR}:{KSTREAMS_JAR.parent / 'lib' / '*'}"
    return ["java", "-cp", classpath, KSTREAMS_MAIN, *args]


def kstreams_version() -> str:
    """The kafka-streams version the project builds against (its pom's)."""
    found = re.search(r"<kafka\.version>([^<]+)<", (KSTREAMS / "pom.xml").read_text())
    return found.group(1) if found else "unknown"


def java_version() -> str:
    """The first line of ``java -version``, or why there is none."""
    if missing_java() is not None:
        return "not installed"
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False,
                          timeout=60)
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[0].replace('"', "") if lines else "unknown"
