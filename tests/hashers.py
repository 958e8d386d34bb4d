"""The tests' password hasher: Django's PBKDF2 at a thousand iterations instead of a million.

A password hashed here is stored as ``pbkdf2_sha256$1000$…``, which the default hasher of the servers the
tests start checks as well (the iterations are read from the hash). Logins, wrong passwords and new users
then cost the tests next to nothing of the CPU they share.
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1000
