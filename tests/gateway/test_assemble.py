"""The non-streamed answer put back together from a stream's events."""

from __future__ import annotations

from adaptive_batcher.gateway.assemble import ResponseAssembler


def completion_event(text: str, finish: str | None, **choice: object) -> dict[str, object]:
    return {
        "id": "c-1",
        "object": "text_completion",
        "created": 5,
        "model": "m",
        "choices": [{"index": 0, "text": text, "finish_reason": finish, **choice}],
    }


def test_vllms_stop_reason_is_kept_where_the_engine_sends_one() -> None:
    vllm = ResponseAssembler(chat=False)
    vllm.add(completion_event("a", None, stop_reason=None))
    vllm.add(completion_event("b", "stop", stop_reason="###"))
    (choice,) = vllm.result()["choices"]
    assert choice == {
        "index": 0,
        "text": "ab",
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": "###",
    }
    plain = ResponseAssembler(chat=False)  # an engine without the field: none is made up
    plain.add(completion_event("a", "length"))
    assert "stop_reason" not in plain.result()["choices"][0]
    eos = ResponseAssembler(chat=True)  # vLLM's null at an end of sequence stays null
    eos.add({"choices": [{"index": 0, "delta": {"content": "x"}, "stop_reason": None}]})
    eos.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": None}]})
    assert eos.result()["choices"][0]["stop_reason"] is None
