"""Request bodies: JSON, forms and uploads, media, and the OpenAI request schemas."""
