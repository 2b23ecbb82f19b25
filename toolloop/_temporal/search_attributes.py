"""The search attributes' typed keys, for the workflows (which set how a request ended, and start a thread's
requests) and the client side (which sets whose a request is, and lists by them): written once."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from toolloop._core.contracts import Actor
from toolloop._core.names import (
    DECIDERS_SEARCH_ATTRIBUTE,
    OUTCOME_SEARCH_ATTRIBUTE,
    POLICY_RULES_SEARCH_ATTRIBUTE,
    TENANT_SEARCH_ATTRIBUTE,
    THREAD_SEARCH_ATTRIBUTE,
    UNSETTLED_SEARCH_ATTRIBUTE,
    USER_SEARCH_ATTRIBUTE,
)

USER_KEY = SearchAttributeKey.for_keyword(USER_SEARCH_ATTRIBUTE)
TENANT_KEY = SearchAttributeKey.for_keyword(TENANT_SEARCH_ATTRIBUTE)
OUTCOME_KEY = SearchAttributeKey.for_keyword(OUTCOME_SEARCH_ATTRIBUTE)
UNSETTLED_KEY = SearchAttributeKey.for_bool(UNSETTLED_SEARCH_ATTRIBUTE)
THREAD_KEY = SearchAttributeKey.for_keyword(THREAD_SEARCH_ATTRIBUTE)
DECIDERS_KEY = SearchAttributeKey.for_keyword_list(DECIDERS_SEARCH_ATTRIBUTE)
POLICY_RULES_KEY = SearchAttributeKey.for_keyword_list(POLICY_RULES_SEARCH_ATTRIBUTE)


def request_search_attributes(actor: Actor, thread_id: str | None = None) -> TypedSearchAttributes:
    """What finds a request in the UI's list: whose it is, its thread (if it is a message of one), and (until
    the workflow says how it ended) running."""
    pairs = [
        SearchAttributePair(USER_KEY, actor.user_id),
        SearchAttributePair(TENANT_KEY, actor.tenant_id),
        SearchAttributePair(OUTCOME_KEY, "running"),
    ]
    if thread_id is not None:
        pairs.append(SearchAttributePair(THREAD_KEY, thread_id))
    return TypedSearchAttributes(pairs)


def thread_search_attributes(actor: Actor, thread_id: str) -> TypedSearchAttributes:
    """What finds a thread's own workflow: whose it is, and its id (its requests carry the same)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(USER_KEY, actor.user_id),
            SearchAttributePair(TENANT_KEY, actor.tenant_id),
            SearchAttributePair(THREAD_KEY, thread_id),
        ]
    )
