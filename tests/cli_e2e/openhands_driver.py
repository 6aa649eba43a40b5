"""Drive the OpenHands SDK (trixie's python3.13, scripts/setup_clis.sh) against an OpenAI-compatible URL.

usage: python openhands_driver.py URL SESSION WORKDIR PROMPT [--stream] [--max-input-tokens=N]
PROMPT ``-`` reads the prompt from stdin (a 1 MB prompt is over the kernel's 128 KiB limit on one argument).
Prints one JSON line at the end: {"finished": bool, "last_agent_text": str}. Exit 0 when the
conversation ran to its end.
"""

import json
import sys

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.sdk.event import MessageEvent
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool


def main() -> int:
    url, session, workdir, prompt = sys.argv[1:5]
    if prompt == "-":
        prompt = sys.stdin.read()
    stream = "--stream" in sys.argv[5:]
    max_input = next((int(a.split("=", 1)[1]) for a in sys.argv[5:] if a.startswith("--max-input-tokens=")), 60000)
    llm = LLM(model="openai/tiny", base_url=f"{url}/v1", api_key=session, usage_id="agent", num_retries=0,
              stream=stream, max_output_tokens=512, max_input_tokens=max_input)
    agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)])
    texts: list[str] = []

    def on_event(event: object) -> None:
        if isinstance(event, MessageEvent) and event.source == "agent":
            texts.extend(getattr(c, "text", "") for c in event.llm_message.content)

    conversation = Conversation(agent=agent, workspace=workdir, callbacks=[on_event], visualizer=None)
    conversation.send_message(prompt)
    conversation.run()
    status = str(conversation.state.execution_status)
    print(json.dumps({"status": status, "last_agent_text": texts[-1] if texts else ""}))
    return 0 if status.lower().endswith("finished") else 1


if __name__ == "__main__":
    sys.exit(main())
