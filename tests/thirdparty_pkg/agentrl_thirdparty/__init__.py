"""Example third-party agentrl env package (a test fixture). Importing it must not register
anything: agentrl discovers ``thirdparty/Echo-v0`` through the entry point alone."""
