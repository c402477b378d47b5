"""Sign-up (a person and their organisation) and where a signed-in person lands."""

from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import redirect, render

from ibex.accounts import services as accounts
from web.forms import SignUpForm
from web.orgs import organization_for


def signup(request):
    if request.user.is_authenticated:
        return redirect("web:home")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            user = form.save()
            accounts.create_organization(
                slug=form.cleaned_data["organization_slug"],
                name=form.cleaned_data["organization"],
                roles=tuple(form.cleaned_data["roles"]), owner=user)
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("web:home")
    return render(request, "registration/signup.html", {"form": form})


@login_required
def home(request):
    """Each role lands on its own page: a tenant on its dashboard, a provider on its fleet, an
    operator on the operations page."""
    org = organization_for(request.user)
    if org is not None and not org.is_tenant:
        if org.is_provider:
            return redirect("web:provider")
        if org.is_operator:
            return redirect("web:ops")
    return redirect("web:dashboard")
