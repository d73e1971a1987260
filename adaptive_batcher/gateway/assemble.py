"""A streamed OpenAI answer put back together as the answer without streaming, for a client
that asked ``stream: false`` (the gateway always streams upstream: the gate needs the time of
the first token).

Text (``text``, ``delta.content``, ``delta.reasoning_content``) is joined per choice, tool-call
deltas are merged by their ``index`` (``function.arguments`` joined), the last
``finish_reason``, the last ``stop_reason`` (vLLM's; only where the engine sends one) and the
``usage`` are kept. Log probabilities are not merged (``logprobs`` is
null in the answer).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ResponseAssembler"]


class ResponseAssembler:
    """Collects a stream's parsed events; :meth:`result` is the non-streamed answer.

    Args:
        chat: a chat completion (``chat.completion`` with messages) or a text completion
            (``text_completion``).
    """

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: Any = None

    def add(self, event: dict[str, Any]) -> None:
        """One parsed stream event (a JSON object)."""
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in event and key not in self._head:
                self._head[key] = event[key]
        if event.get("usage") is not None:
            self._usage = event["usage"]
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict):
                self._add_choice(choice)

    def result(self) -> dict[str, Any]:
        """The answer as the server would have given it without streaming."""
        answer: dict[str, Any] = {
            "id": self._head.get("id", ""),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self._head.get("created", 0),
            "model": self._head.get("model", ""),
            "choices": [self._finish(i, c) for i, c in sorted(self._choices.items())],
        }
        if "system_fingerprint" in self._head:
            answer["system_fingerprint"] = self._head["system_fingerprint"]
        if self._usage is not None:
            answer["usage"] = self._usage
        return answer

    def _add_choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        index = index if isinstance(index, int) else 0
        state = self._choices.setdefault(
            index, {"text": [], "reasoning": [], "tools": {}, "finish_reason": None, "role": None}
        )
        if choice.get("finish_reason") is not None:
            state["finish_reason"] = choice["finish_reason"]
        if "stop_reason" in choice and (
            choice["stop_reason"] is not None or "stop_reason" not in state
        ):
            state["stop_reason"] = choice["stop_reason"]
        if isinstance(choice.get("text"), str):
            state["text"].append(choice["text"])
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("role"), str):
            state["role"] = delta["role"]
        if isinstance(delta.get("content"), str):
            state["text"].append(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            state["reasoning"].append(delta["reasoning_content"])
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_tool_call(state["tools"], call)

    def _finish(self, index: int, state: dict[str, Any]) -> dict[str, Any]:
        text = "".join(state["text"])
        stop = {"stop_reason": state["stop_reason"]} if "stop_reason" in state else {}
        if not self.chat:
            return {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": state["finish_reason"],
                **stop,
            }
        message: dict[str, Any] = {"role": state["role"] or "assistant", "content": text}
        if state["reasoning"]:
            message["reasoning_content"] = "".join(state["reasoning"])
        if state["tools"]:
            message["tool_calls"] = [state["tools"][i] for i in sorted(state["tools"])]
        return {
            "index": index,
            "message": message,
            "logprobs": None,
            "finish_reason": state["finish_reason"],
            **stop,
        }


def _merge_tool_call(tools: dict[int, dict[str, Any]], call: dict[str, Any]) -> None:
    index = call.get("index", len(tools))
    index = index if isinstance(index, int) else len(tools)
    merged = tools.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if call.get("id"):
        merged["id"] = call["id"]
    if isinstance(call.get("type"), str):
        merged["type"] = call["type"]
    function = call.get("function")
    if isinstance(function, dict):
        for key in ("name", "arguments"):
            if isinstance(function.get(key), str):
                merged["function"][key] += function[key]
