"""Callbacks that watch a run and report: device statistics, throughput, loss spikes."""

from .device_stats_monitor import DeviceStatsMonitor
from .spike import SpikeDetection, TrainingSpikeException
from trainer.utilities.throughput import Throughput, measure_flops
from .throughput_monitor import ThroughputMonitor

__all__ = [
    "DeviceStatsMonitor",
    "SpikeDetection",
    "Throughput",
    "ThroughputMonitor",
    "TrainingSpikeException",
    "measure_flops",
]
