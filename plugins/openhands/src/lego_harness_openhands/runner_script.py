"""Runs inside the sandbox under Python >= 3.12: one OpenHands SDK conversation against the adapter.

Uploaded by the lego ``openhands`` harness and run as ``python3.13 runner_script.py RUN_JSON``. It
prints one JSON line per SDK event, then a final ``{"type": "lego_result", ...}`` line that the
harness reads; exit status 0 means the agent finished, 1 that it stopped otherwise.
This file must not import lego_rl (it is not installed in the sandbox).
"""

import json
import sys


def main(path: str) -> int:
    with open(path) as fh:
        run = json.load(fh)
    from openhands.sdk import LLM, Agent, Conversation, Tool
    from openhands.tools.file_editor import FileEditorTool
    from openhands.tools.terminal import TerminalTool

    llm = LLM(
        model="openai/" + run["model"],
        base_url=run["base_url"],
        api_key=run["api_key"],
        usage_id="agent",
        num_retries=run.get("num_retries", 2),
        retry_min_wait=1,
        retry_max_wait=4,
        max_input_tokens=run["max_context_tokens"],
        max_output_tokens=run["max_response_tokens"],
    )
    tools = [Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)]
    error: dict[str, object] = {}

    def on_event(event):
        data = json.loads(event.model_dump_json())
        if type(event).__name__ == "ConversationErrorEvent":
            error.update(code=data.get("code"), detail=data.get("detail"))
        print(json.dumps({"type": "event", "kind": type(event).__name__, "data": data}), flush=True)

    conversation = Conversation(
        agent=Agent(llm=llm, tools=tools),
        workspace=run["workdir"],
        callbacks=[on_event],
        max_iteration_per_run=run["max_turns"],
        visualizer=None,
    )
    conversation.send_message(run["prompt"])
    try:
        conversation.run()
    except Exception as exc:  # the SDK raises after emitting its error event; report, do not trace back
        error.setdefault("code", type(exc).__name__)
        error.setdefault("detail", str(exc)[:500])
    status = str(getattr(conversation.state.execution_status, "value", conversation.state.execution_status))
    print(json.dumps({"type": "lego_result", "status": status, "error": error or None}), flush=True)
    return 0 if status == "finished" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
