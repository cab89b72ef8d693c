"""mlxcore plugin ``kv-events``: the prefix cache's changes as vLLM's KV events.

Off until ``--kv-events-endpoint tcp://*:5557`` names a ZMQ address to bind. Every
prefix the radix cache stores, splits or evicts is then published as vLLM's
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events over blocks of
``--kv-events-block-size`` tokens (:mod:`mlxcore_kv_events.blocks`,
:mod:`mlxcore_kv_events.publisher`), so ``vllm-router --policy kv_aware
--kv-event-source http://REPLICA:8000=tcp://REPLICA:5557`` sends each request to the
replica holding the longest prefix of it. See docs/replicas.md.
"""

from __future__ import annotations

import logging

import attrs
import zmq

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo
from mlxcore.settings import add_flags, read_settings, setting
from mlxcore_kv_events.blocks import BlockMirror
from mlxcore_kv_events.publisher import EventPublisher

log = logging.getLogger("mlxcore.plugins.kv_events")


@attrs.frozen
class KVEventSettings:
    """The kv-events plugin's settings; each default is stated here only."""

    kv_events_endpoint: str | None = setting(
        None, metavar="ADDRESS",
        help="publish the prefix cache's changes as vLLM KV events on this ZMQ address "
        "(tcp://*:5557; for vllm-router's kv_aware policy; default: not published)",
    )  # fmt: skip
    kv_events_block_size: int = setting(
        16, type=int, metavar="TOKENS",
        help="tokens per KV block in the events (the router's --kv-event-block-size)",
    )  # fmt: skip
    kv_events_topic: str = setting(
        "", metavar="TOPIC", help="the topic frame of every KV-event message",
    )  # fmt: skip


_publishers: dict[str, EventPublisher] = {}
"""This process's publisher per bound address."""


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--kv-events-endpoint``, ``--kv-events-block-size``, ``--kv-events-topic``."""
    add_flags(parser, KVEventSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the settings and bind the socket (a taken address fails the start-up)."""
    settings = read_settings(config, KVEventSettings)
    if not 1 <= settings.kv_events_block_size <= 4096:
        raise UsageError("--kv-events-block-size must be between 1 and 4096 tokens")
    address = settings.kv_events_endpoint
    if address and address not in _publishers:
        try:
            _publishers[address] = EventPublisher(address, settings.kv_events_topic)
        except zmq.ZMQError as exc:
            raise UsageError(f"--kv-events-endpoint {address}: {exc}") from exc
        log.info(
            "kv-events: publishing the prefix cache as vLLM KV events on %s (blocks of %d)",
            address,
            settings.kv_events_block_size,
        )


@hookimpl
def mlxcore_prefix_cache_watcher(info: ModelInfo, config: ServerConfig) -> BlockMirror | None:
    """A mirror of this model's radix tree, publishing its changes."""
    settings = read_settings(config, KVEventSettings)
    publisher = _publishers.get(settings.kv_events_endpoint or "")
    if publisher is None:
        return None
    mirror = BlockMirror(publisher, settings.kv_events_block_size)
    publisher.add(mirror)
    return mirror
