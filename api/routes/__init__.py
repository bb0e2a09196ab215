API_PREFIX = "/api/v1"
