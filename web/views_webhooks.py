"""A tenant's webhook endpoints (the secret shown once), the delivery log, and its events.
State changes go through `notify.webhooks`."""

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from notify import webhooks
from notify.models import Event, WebhookDelivery, WebhookEndpoint
from web.orgs import tenant_required

PER_PAGE = 20


class EndpointForm(forms.Form):
    url = forms.CharField(label="Endpoint URL", max_length=500,
                          help_text="http or https; we POST each event as signed JSON.",
                          widget=forms.URLInput(attrs={"placeholder": "https://example.com/ibex"}))
    description = forms.CharField(label="Description", max_length=200, required=False)


@tenant_required
def webhooks_page(request):
    org = request.organization
    form = EndpointForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            endpoint = webhooks.create_endpoint(tenant=org, url=form.cleaned_data["url"],
                                                description=form.cleaned_data["description"])
        except webhooks.WebhookError as exc:
            form.add_error("url" if exc.field == "url" else None, exc.message)
        else:
            # shown once, on the next page: the session keeps it only until then
            request.session["webhook_secret"] = [endpoint.pk, endpoint.secret]
            return redirect("web:webhooks")
    secret = request.session.pop("webhook_secret", None) if request.method == "GET" else None
    deliveries = Paginator(
        WebhookDelivery.objects.filter(endpoint__tenant=org)
        .select_related("endpoint", "event").order_by("-created_at", "-id"),
        PER_PAGE).get_page(request.GET.get("deliveries"))
    events = Paginator(Event.objects.filter(tenant=org).order_by("-id"),
                       PER_PAGE).get_page(request.GET.get("events"))
    return render(request, "web/webhooks.html", {
        "org": org, "form": form, "deliveries": deliveries, "events": events,
        "endpoints": WebhookEndpoint.objects.filter(tenant=org).order_by("-created_at"),
        "new_secret": {"endpoint": secret[0], "secret": secret[1]} if secret else None},
        status=400 if form.errors else 200)


@require_POST
@tenant_required
def toggle_endpoint(request, endpoint_id: int):
    endpoint = get_object_or_404(WebhookEndpoint, pk=endpoint_id, tenant=request.organization)
    endpoint = webhooks.update_endpoint(endpoint=endpoint, active=not endpoint.active)
    messages.success(request, f"Endpoint {endpoint.url} {'enabled' if endpoint.active else 'paused'}.")
    return redirect("web:webhooks")


@require_POST
@tenant_required
def delete_endpoint(request, endpoint_id: int):
    endpoint = get_object_or_404(WebhookEndpoint, pk=endpoint_id, tenant=request.organization)
    webhooks.delete_endpoint(endpoint=endpoint)
    messages.success(request, f"Endpoint {endpoint.url} deleted.")
    return redirect("web:webhooks")


@require_POST
@tenant_required
def redeliver(request, delivery_id: int):
    delivery = get_object_or_404(WebhookDelivery, pk=delivery_id,
                                 endpoint__tenant=request.organization)
    delivery = webhooks.redeliver(delivery=delivery)
    messages.success(request, f"Delivery {delivery.pk} of event {delivery.event_id} "
                              f"{'queued again' if delivery.state == 'pending' else delivery.state}.")
    return redirect("web:webhooks")
