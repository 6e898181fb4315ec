"""The HTTP rules without a server: paths, stream events, read deadlines."""

from __future__ import annotations

from kernelbox_client import _wire


def test_a_slow_readers_dropped_output_is_counted_on_the_result() -> None:
    reader = _wire.StreamReader()
    assert reader.feed('{"event":"output","data":"a","stream":"stdout"}') == ("stdout", "a")
    assert reader.feed('{"event":"output_truncated","bytes":1234}') is None
    reader.feed('{"event":"result","result":{"status":"success","output":"a","exit_code":0,'
                '"tool_calls_made":0,"duration_seconds":0.1,"kernel":{"id":"k"}}}')  # fmt: skip
    r = reader.finish()
    assert (r.status, r.output, r.stream_bytes_dropped, r.kernel.id) == ("success", "a", 1234, "k")


def test_a_display_event_becomes_a_result_object() -> None:
    kind, result = _wire.StreamReader().feed(
        '{"event":"display","data":{"data":{"text/plain":"x","image/png":"iVBORw=="},'
        '"metadata":{},"is_main_result":false}}'
    )
    assert kind == "display" and result.text == "x" and result.png == b"\x89PNG"


def test_paths_are_sent_as_given_for_the_server_to_judge() -> None:
    assert _wire.file_path("s", "a b/c.txt") == "/v1/sessions/s/files/a%20b/c.txt"
    assert _wire.file_path("s", "../x") == "/v1/sessions/s/files/%2E%2E/x"
    assert _wire.file_path("s", ".") == _wire.file_path("s", "") == "/v1/sessions/s/files"
    assert _wire.session_path("a:b@c", "execute") == "/v1/sessions/a%3Ab%40c/execute"


def test_a_runs_read_deadline_outlasts_its_cell() -> None:
    call = _wire.execute_call("s", None, "1", 10, False, None, None, False, 30)
    assert call.read_timeout == 40
    assert (
        _wire.execute_call("s", None, "1", None, False, None, None, False, 30).read_timeout == 3630
    )
    huge = _wire.execute_call("s", None, "1", 1e300, False, None, None, False, 30)
    assert huge.read_timeout == _wire.MAX_CELL_WAIT + 30


def test_an_answer_nested_too_deep_is_a_protocol_error_not_a_recursion_error() -> None:
    deep = b"[" * 200000 + b"]" * 200000
    for call in (lambda: _wire.json_body(deep, "x"),
                 lambda: _wire.StreamReader().feed(deep.decode())):  # fmt: skip
        try:
            call()
        except _wire.ProtocolError as e:
            assert e.code == "invalid_response", e
        else:
            raise AssertionError("no error")


def test_a_json_display_nested_too_deep_reads_as_a_value_error() -> None:
    from kernelbox_client import Result

    deep = Result.from_json({"data": {"application/json": "[" * 200000 + "]" * 200000}})
    try:
        deep.json
    except ValueError as e:
        assert "too deep" in str(e), e
    else:
        raise AssertionError("no error")
