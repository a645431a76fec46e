pytest_plugins = ["tests.server_fixtures", "tests.ray_fixtures"]
