"""The web login, rate limited: failed attempts are counted per address and user name, and per
address alone; past the limit the form answers 429 until the window ends."""

from django.contrib.auth import views as auth_views

from ibex import ratelimit

TOO_MANY = "Too many failed log-in attempts. Wait a few minutes and try again."


class LoginView(auth_views.LoginView):
    redirect_authenticated_user = True

    def _idents(self) -> list[tuple[str, str]]:
        address = ratelimit.client_ip(self.request)
        username = self.request.POST.get("username", "").strip().lower()[:150]
        return [("login", f"{address}:{username}"), ("login-address", address)]

    def post(self, request, *args, **kwargs):
        if any(ratelimit.exhausted(scope, ident) for scope, ident in self._idents()):
            form = self.get_form()
            form.errors.clear()
            form.add_error(None, TOO_MANY)
            return self.render_to_response(self.get_context_data(form=form), status=429)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        for scope, ident in self._idents():
            ratelimit.allowed(scope, ident)
        return super().form_invalid(form)
