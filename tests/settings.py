"""The settings the tests run under (pyproject's DJANGO_SETTINGS_MODULE): llmgw's own, read with a data
directory of this run's, whatever the environment says. `make` exports LLMGW_DATA_DIR=$(CURDIR)/var, the
demo's data; reading the settings there would already write into it (its secret key, static root), and
a test minting node tokens would overwrite the demo's and take its nodes offline. pytest-django reads the
settings before any conftest, hence here."""

import os
import tempfile

os.environ["LLMGW_DATA_DIR"] = tempfile.mkdtemp(prefix="llmgw-tests-data-")
# The servers and commands the tests start read llmgw's settings themselves, in this directory too.
os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw.settings"

from llmgw.settings import *  # noqa: E402, F403

# Passwords hashed at a thousand iterations (tests/hashers.py), checked by any PBKDF2 hasher.
PASSWORD_HASHERS = ["tests.hashers.QuickPBKDF2PasswordHasher", "django.contrib.auth.hashers.PBKDF2PasswordHasher"]
