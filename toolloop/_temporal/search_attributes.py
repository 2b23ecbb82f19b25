"""The search attributes' typed keys, for the workflow (which sets how a request ended) and the client side
(which sets whose it is, and lists by them): written once."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

from toolloop._core.names import (
    OUTCOME_SEARCH_ATTRIBUTE,
    TENANT_SEARCH_ATTRIBUTE,
    UNSETTLED_SEARCH_ATTRIBUTE,
    USER_SEARCH_ATTRIBUTE,
)

USER_KEY = SearchAttributeKey.for_keyword(USER_SEARCH_ATTRIBUTE)
TENANT_KEY = SearchAttributeKey.for_keyword(TENANT_SEARCH_ATTRIBUTE)
OUTCOME_KEY = SearchAttributeKey.for_keyword(OUTCOME_SEARCH_ATTRIBUTE)
UNSETTLED_KEY = SearchAttributeKey.for_bool(UNSETTLED_SEARCH_ATTRIBUTE)
