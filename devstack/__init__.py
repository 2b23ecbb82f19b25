"""I/O: the local stack - Temporal dev server, business service and worker as real processes."""

from .processes import (
    ManagedProcess,
    ProcessStartError,
    StackError,
    free_port,
    port_in_use,
    start_business_service,
    start_temporal_dev_server,
    start_worker,
    temporal_binary,
    temporal_dev_server_command,
    wait_for_http_ok,
    wait_for_log_line,
    wait_for_port,
    wait_for_temporal,
)
from .stack import ComponentStatus, ComponentStop, DownReport, LocalStack, StackStatus

__all__ = [
    "ComponentStatus",
    "ComponentStop",
    "DownReport",
    "LocalStack",
    "ManagedProcess",
    "ProcessStartError",
    "StackError",
    "StackStatus",
    "free_port",
    "port_in_use",
    "start_business_service",
    "start_temporal_dev_server",
    "start_worker",
    "temporal_binary",
    "temporal_dev_server_command",
    "wait_for_http_ok",
    "wait_for_log_line",
    "wait_for_port",
    "wait_for_temporal",
]
