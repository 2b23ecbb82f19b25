"""Pure: names that are part of stored histories (workflow, activities, queries). Never rename these."""

AGENT_WORKFLOW = "AgentWorkflow"
MODEL_TURN_ACTIVITY = "model_turn"
RUN_TOOL_ACTIVITY = "run_tool"
GET_PROGRESS_QUERY = "get_progress"
USER_SEARCH_ATTRIBUTE = "ToolloopUser"
EXECUTE_WRITE_ACTIVITY = "execute_write"
QUERY_OPERATION_STATUS_ACTIVITY = "query_operation_status"
READ_BACK_ACTIVITY = "read_back_operation"
REQUEST_ENDED_ACTIVITY = "request_ended"
# Runs on the policy evaluator's own task queue, where the policy's signing key is (docs/POLICIES.md).
DECIDE_BY_POLICY_ACTIVITY = "decide_by_policy"
APPROVE_OPERATION_UPDATE = "approve_operation"
GET_LEDGER_QUERY = "get_ledger"
GET_APPROVAL_REQUEST_QUERY = "get_approval_request"
GET_EVENTS_QUERY = "get_events"
GET_PENDING_APPROVALS_QUERY = "get_pending_approvals"
NEXT_APPROVAL_UPDATE = "next_approval"
# A thread: one workflow per conversation, which starts each message's request as a child AgentWorkflow.
THREAD_WORKFLOW = "ThreadWorkflow"
SEND_MESSAGE_UPDATE = "send_message"
CLOSE_THREAD_UPDATE = "close_thread"
GET_THREAD_QUERY = "get_thread"
# Reads the ledger of a message's request that ended without a report (terminated, timed out).
REQUEST_LEDGER_ACTIVITY = "request_ledger"
# Search attributes (registered on the server: the dev server of the local stack and the tests registers them
# at start, docker-compose by a job). The starter sets user and tenant; the workflow sets outcome and unsettled.
TENANT_SEARCH_ATTRIBUTE = "ToolloopTenant"
# Keyword: running | answered | not_done | unknown | stopped | failed (contracts.outcome_of)
OUTCOME_SEARCH_ATTRIBUTE = "ToolloopOutcome"
UNSETTLED_SEARCH_ATTRIBUTE = "ToolloopUnsettled"  # Bool: a side effect is unknown or done but not verified
# Keyword: the thread a request is a message of (set on the thread's workflow too)
THREAD_SEARCH_ATTRIBUTE = "ToolloopThread"
# KeywordList, set only where an approval policy decides writes: who may decide the operations waiting now
# ("user:u1", "role:manager"; empty once none waits), and the rules that decided the request's writes.
DECIDERS_SEARCH_ATTRIBUTE = "ToolloopDeciders"
POLICY_RULES_SEARCH_ATTRIBUTE = "ToolloopPolicyRules"
SEARCH_ATTRIBUTES = {
    USER_SEARCH_ATTRIBUTE: "Keyword",
    TENANT_SEARCH_ATTRIBUTE: "Keyword",
    OUTCOME_SEARCH_ATTRIBUTE: "Keyword",
    UNSETTLED_SEARCH_ATTRIBUTE: "Bool",
    THREAD_SEARCH_ATTRIBUTE: "Keyword",
    DECIDERS_SEARCH_ATTRIBUTE: "KeywordList",
    POLICY_RULES_SEARCH_ATTRIBUTE: "KeywordList",
}
# Metric names (Prometheus, through Temporal's metric meter).
TOOL_RESULTS_METRIC = "toolloop_tool_results"
WRITE_ATTEMPTS_METRIC = "toolloop_write_attempts"
OPERATIONS_METRIC = "toolloop_operations"
REQUESTS_FINISHED_METRIC = "toolloop_requests_finished"
# Counted by the model-turn activity, `kind` input | output | cached (the part of input served from the cache).
MODEL_TOKENS_METRIC = "toolloop_model_tokens"
API_RESPONSES_METRIC = "toolloop_api_responses"
API_DECISIONS_METRIC = "toolloop_api_decisions"
