"""The Textual face: the app shell, screens and widgets."""
