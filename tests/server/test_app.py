"""The server's start-up line for newcomers: the page and the client command, on its real port."""

from voicert.server.app import where_to_start


def test_the_start_line_names_the_page_and_the_client_command_on_the_port_taken():
    line = where_to_start("0.0.0.0", 9123)
    assert "open http://localhost:9123/ in a browser" in line
    assert "voicert client YOUR.wav --url ws://localhost:9123/v1/stream" in line
    assert "http://127.0.0.1:80/" in where_to_start("127.0.0.1", 80)
    assert "http://[::1]:8765/" in where_to_start("::1", 8765)
