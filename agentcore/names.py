"""Pure: names that are part of stored histories (workflow, activities, queries). Never rename these."""

AGENT_WORKFLOW = "AgentWorkflow"
MODEL_TURN_ACTIVITY = "model_turn"
RUN_TOOL_ACTIVITY = "run_tool"
GET_PROGRESS_QUERY = "get_progress"
USER_SEARCH_ATTRIBUTE = "ToolloopUser"
