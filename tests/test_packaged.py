"""Files found inside installed wheels."""

import pytest

from voicert.config import ConfigError
from voicert.packaged import wheel_file


def test_a_file_is_found_by_name_in_an_installed_distribution():
    path = wheel_file("numpy", lambda name: name == "__init__.py", "hint", "lacks it")
    assert path.is_file() and path.name == "__init__.py"


def test_no_matching_file_or_no_distribution_is_a_config_error_with_the_hint():
    with pytest.raises(ConfigError, match=r"^install me \(the installed numpy lacks it\)$"):
        wheel_file("numpy", lambda name: name == "no-such-file", "install me", "lacks it")
    with pytest.raises(ConfigError, match=r"^install me$"):
        wheel_file("no-such-distribution-here", lambda name: True, "install me", "lacks it")
