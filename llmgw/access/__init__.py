"""Who may come in: API tokens that expire and can be rotated or revoked (ApiToken), and the
authentication that reads them. Its own app so that `llmgw ctl`'s listings, which load no users, load
none of it either (settings.CTL_WEB_ONLY_APPS)."""
