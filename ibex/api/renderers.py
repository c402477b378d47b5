from rest_framework.renderers import BaseRenderer


class PlainTextRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, str):
            return data.encode(self.charset)
        # errors still come back as JSON-shaped text
        import json

        return json.dumps(data).encode(self.charset)
