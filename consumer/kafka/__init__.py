"""Everything that talks to a Kafka broker: the run loop (``processor``), the sinks that
commit output with offsets (``sink``), client configurations (``clients``) and the
output-topic reader (``tail``).

Owns: confluent_kafka calls, rebalances, rewinds, transactions. May import: ``core``,
``config``, ``service`` (the observer protocol it reports to) and ``wire``.
"""
