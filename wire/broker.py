"""Where both command lines look for a Kafka broker when nothing says where.

The daemon's (consumer/cli.py) and the workers' (producer/cli.py) fall back to
``DEFAULT_BOOTSTRAP`` when neither an option nor ``KAFKA_BOOTSTRAP_SERVERS`` names a
broker: the address ``scripts/kafka-local start`` listens on by default, as in
config.yaml.
"""

from __future__ import annotations

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
