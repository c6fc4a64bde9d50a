"""The application layer: the commands a user runs (``gossipnet peer``, ``launch``,
``demo``, ``export``, ``status``) and what they print. May import every layer below."""
