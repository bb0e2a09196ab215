import json
import logging
import sys

from api.logs import JsonFormatter


def test_json_log_lines_carry_level_logger_message_and_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("api.x", logging.ERROR, __file__, 1, "job %s failed", ("job-1",),
                               exc_info)
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["logger"], line["message"]) == ("ERROR", "api.x",
                                                                "job job-1 failed")
    assert "ValueError: boom" in line["exception"]
    assert line["time"].endswith("+00:00")
