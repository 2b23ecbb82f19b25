"""Wiring: the one data converter shared by worker, starter and tests (pydantic models as payloads)."""

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter


def data_converter() -> DataConverter:
    return pydantic_data_converter
