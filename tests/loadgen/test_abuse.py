"""The abuse benchmark against a real server: each abuser is answered (no 5xx), the normal
callers keep being served, and the table names every phase."""

import asyncio

from loadgen import abuse


def test_each_abusive_body_is_refused_or_served_never_a_server_error():
    body = abuse.abusive_body("stops", 10)
    assert len(body["stop"]) == 4 and all(len(s) == 200_000 for s in body["stop"])
    assert len(abuse.abusive_body("history", 10)["messages"]) == 11
    schema = abuse.abusive_body("schema", 10)["tools"][0]["function"]["parameters"]
    assert schema["properties"]["code"]["pattern"] == abuse.HOSTILE_PATTERN


async def test_abusers_get_answers_not_server_errors_while_normal_callers_are_served(server):
    url = f"http://127.0.0.1:{server.port}"
    abuse.MODEL[0] = await asyncio.to_thread(abuse.served_model, url)  # the server is on this loop
    ttfts, errors, seen = await abuse.phase(url, 1, 2.0, ("schema", "stops"), 200)
    assert ttfts and not errors
    statuses = {k for k in seen if k.split(": ")[1].isdigit()}  # (413 may also reset a socket
    # still sending its body: the server answers before reading it)
    assert {k.split(": ")[0] for k in statuses} == {"schema", "stops"}, seen  # each answered
    assert not any(k.split(": ")[1].startswith("5") for k in statuses), seen


async def test_the_table_has_a_row_per_phase(server):
    table = await abuse.run(f"http://127.0.0.1:{server.port}", 1, 1.0, 50, ["stops", "history"])
    names = [line.split(" | ")[0] for line in table.splitlines()[2:]]
    assert names == ["| nobody", "| stops", "| history", "| all at once", "| nobody, again"]


def test_no_server_is_one_line_not_a_traceback(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    assert abuse.main(["--url", f"http://127.0.0.1:{port}", "--seconds", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("loadgen.abuse: no server ready at") and "Traceback" not in err
