"""What reads the model, headless: tables, the failure tree, event lines and the health check (no Textual)."""
