#!/usr/bin/env python3
"""Consume messages from Pulsar topics with the official client (PyPI ``pulsar-client``).

Library::

    from consume import consume          # with tests/pulsar on sys.path
    msgs = consume("pulsar://127.0.0.1:6650", ["persistent://public/default/t1"],
                   idle_timeout_s=5, max_messages=10)
    msgs[0]["key"], msgs[0]["payload"], msgs[0]["sha256"]

Each message becomes a dict::

    topic            full topic name as the broker reports it ("persistent://public/default/t1";
                     for a partitioned topic the partition, "...-partition-0")
    key              partition key (str) or None when the message has none
    ordering_key     ordering key (str, as the client returns it) or None
    event_timestamp  producer-set event time in ms since the epoch, or None when unset (0)
    publish_timestamp broker publish time in ms since the epoch
    properties       dict[str, str]
    message_id       str(MessageId), e.g. "(12,0,-1,0)"
    redelivery_count int
    payload_len      len(payload)
    sha256           hex sha256 of the payload
    payload          the payload bytes (library only; the CLI prints payload_b64 with --payload)

The subscription is Key_Shared, starting at the Earliest message. Without an explicit
``subscription`` a unique name is generated and the subscription is removed afterwards, so each
call reads the topics from the beginning and leaves no state behind. Topics that do not exist yet
are auto-created by the broker (allowAutoTopicCreation=true in tests/pulsar/standalone.conf.in).

Receiving stops at ``max_messages`` messages, after ``idle_timeout_s`` seconds without a message,
or after ``total_timeout_s`` seconds in all, whichever comes first. Chunked messages are
reassembled by the client.

CLI (prints one JSON object per line)::

    python3 tests/pulsar/consume.py [--url pulsar://127.0.0.1:6650] [--idle-timeout 5] [--max N]
        [--payload] [--subscription NAME] [--token T | --token-file F] [--tls-ca ca.pem] TOPIC...
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import time
import uuid
from typing import Any, Iterable, Optional

import pulsar

DEFAULT_URL = "pulsar://127.0.0.1:6650"

__all__ = ["consume", "message_to_dict", "make_client", "DEFAULT_URL"]


def message_to_dict(msg: "pulsar.Message") -> dict[str, Any]:
    """Turn a received pulsar.Message into a plain dict (see the module docstring)."""
    payload = msg.data()
    key = msg.partition_key()
    ordering_key = msg.ordering_key()
    event_ts = msg.event_timestamp()
    return {
        "topic": msg.topic_name(),
        "key": key if key else None,
        "ordering_key": ordering_key if ordering_key else None,
        "event_timestamp": event_ts if event_ts else None,
        "publish_timestamp": msg.publish_timestamp(),
        "properties": dict(msg.properties()),
        "message_id": str(msg.message_id()),
        "redelivery_count": msg.redelivery_count(),
        "payload_len": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": payload,
    }


def make_client(
    service_url: str = DEFAULT_URL,
    *,
    token: Optional[str] = None,
    tls_trust_certs_file_path: Optional[str] = None,
    log_level: str = "warn",
    **client_kwargs: Any,
) -> "pulsar.Client":
    """A pulsar.Client with quiet logging, optional token auth and optional TLS trust store."""
    kwargs: dict[str, Any] = dict(client_kwargs)
    if token:
        kwargs.setdefault("authentication", pulsar.AuthenticationToken(token))
    if tls_trust_certs_file_path:
        kwargs.setdefault("tls_trust_certs_file_path", tls_trust_certs_file_path)
    if "logger" not in kwargs:
        level = {
            "debug": pulsar.LoggerLevel.Debug,
            "info": pulsar.LoggerLevel.Info,
            "warn": pulsar.LoggerLevel.Warn,
            "error": pulsar.LoggerLevel.Error,
        }[log_level.lower()]
        kwargs["logger"] = pulsar.ConsoleLogger(level)
    return pulsar.Client(service_url, **kwargs)


def consume(
    service_url: str,
    topics: Iterable[str] | str,
    idle_timeout_s: float = 5.0,
    max_messages: Optional[int] = None,
    *,
    subscription: Optional[str] = None,
    unsubscribe: Optional[bool] = None,
    total_timeout_s: Optional[float] = None,
    ack: bool = True,
    token: Optional[str] = None,
    tls_trust_certs_file_path: Optional[str] = None,
    client: Optional["pulsar.Client"] = None,
    receiver_queue_size: int = 1000,
    max_pending_chunked_message: int = 100,
    consumer_type: Optional["pulsar.ConsumerType"] = None,
    crypto_key_reader: Optional["pulsar.CryptoKeyReader"] = None,
    crypto_failure_action: Optional["pulsar.ConsumerCryptoFailureAction"] = None,
    **client_kwargs: Any,
) -> list[dict[str, Any]]:
    """Subscribe (Key_Shared unless ``consumer_type`` says otherwise, Earliest) to ``topics`` and
    return the received messages as dicts. Key_Shared orders messages per key only; pass
    ``pulsar.ConsumerType.Exclusive`` to check the order across keys.

    ``unsubscribe`` defaults to True when the subscription name was generated, False when given.
    Pass ``client`` to reuse an existing pulsar.Client (it is then not closed here).
    """
    if isinstance(topics, str):
        topics = [topics]
    topics = list(topics)
    if not topics:
        raise ValueError("no topics given")
    if max_messages is not None and max_messages <= 0:
        return []
    if subscription is None:
        subscription = f"rigd-consume-{uuid.uuid4().hex[:12]}"
        if unsubscribe is None:
            unsubscribe = True
    own_client = client is None
    if own_client:
        client = make_client(
            service_url,
            token=token,
            tls_trust_certs_file_path=tls_trust_certs_file_path,
            **client_kwargs,
        )
    out: list[dict[str, Any]] = []
    try:
        consumer = client.subscribe(
            topics if len(topics) > 1 else topics[0],
            subscription,
            consumer_type=consumer_type or pulsar.ConsumerType.KeyShared,
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=receiver_queue_size,
            max_pending_chunked_message=max_pending_chunked_message,
            **({"crypto_key_reader": crypto_key_reader} if crypto_key_reader else {}),
            **({"crypto_failure_action": crypto_failure_action} if crypto_failure_action is not None else {}),
        )
        try:
            deadline = None if total_timeout_s is None else time.monotonic() + total_timeout_s
            while max_messages is None or len(out) < max_messages:
                wait = idle_timeout_s
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        break
                try:
                    msg = consumer.receive(timeout_millis=max(1, int(wait * 1000)))
                except pulsar.Timeout:
                    break
                out.append(message_to_dict(msg))
                if ack:
                    consumer.acknowledge(msg)
            if unsubscribe:
                try:
                    consumer.unsubscribe()
                except Exception:  # best effort: the data was read already
                    pass
        finally:
            try:
                consumer.close()
            except Exception:
                pass
    finally:
        if own_client:
            client.close()
    return out


def _main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="Consume Pulsar topics (Key_Shared, from Earliest) and print NDJSON, one line per message."
    )
    ap.add_argument("topics", nargs="+", help="topic names (persistent://tenant/ns/name or short names)")
    ap.add_argument("--url", default=os.environ.get("PULSAR_SERVICE_URL", DEFAULT_URL),
                    help="service URL (default: $PULSAR_SERVICE_URL or %(default)s)")
    ap.add_argument("--idle-timeout", type=float, default=5.0,
                    help="stop after this many seconds without a message (default 5)")
    ap.add_argument("--max", type=int, default=None, help="stop after N messages")
    ap.add_argument("--total-timeout", type=float, default=None, help="stop after this many seconds in all")
    ap.add_argument("--payload", action="store_true", help="include payload_b64 in the output")
    ap.add_argument("--subscription", default=None,
                    help="subscription name (default: a unique one, removed afterwards)")
    ap.add_argument("--keep-subscription", action="store_true",
                    help="do not unsubscribe a generated subscription")
    ap.add_argument("--no-ack", action="store_true", help="do not acknowledge messages")
    ap.add_argument("--token", default=None, help="JWT for token authentication")
    ap.add_argument("--token-file", default=None, help="file holding the JWT")
    ap.add_argument("--tls-ca", default=None, help="CA file for pulsar+ssl:// URLs")
    ap.add_argument("--log-level", default="warn", choices=["debug", "info", "warn", "error"])
    args = ap.parse_args(argv)

    token = args.token
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    unsubscribe = None
    if args.keep_subscription:
        unsubscribe = False
    msgs = consume(
        args.url,
        args.topics,
        idle_timeout_s=args.idle_timeout,
        max_messages=args.max,
        subscription=args.subscription,
        unsubscribe=unsubscribe,
        total_timeout_s=args.total_timeout,
        ack=not args.no_ack,
        token=token,
        tls_trust_certs_file_path=args.tls_ca,
        log_level=args.log_level,
    )
    for m in msgs:
        payload = m.pop("payload")
        if args.payload:
            m["payload_b64"] = base64.b64encode(payload).decode("ascii")
        if isinstance(m["ordering_key"], bytes):
            m["ordering_key"] = base64.b64encode(m["ordering_key"]).decode("ascii")
        sys.stdout.write(json.dumps(m, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
