"""Forms of the web pages: they validate what people type; the services decide."""

from django import forms
from django.contrib.auth.forms import UserCreationForm
from django.utils.text import slugify

from billing.core.money import BadAmount, parse_dollars
from fabric.api import MAX_UPLOAD_BYTES
from fabric.core import qos
from ibex.accounts.models import ApiKey, Organization
from market.models import Lease, Order
from pool.models import GpuModel, PriorityClass

LEVEL_CHOICES = [("", "anywhere"), ("node", "one node"), ("leaf", "one leaf"),
                 ("spine", "one spine block")]


class SignUpForm(UserCreationForm):
    organization = forms.CharField(max_length=200, label="Organisation",
                                   help_text="Your company, lab or team.")
    roles = forms.MultipleChoiceField(
        choices=[("tenant", "Rent GPUs (tenant)"), ("provider", "Provide GPUs (provider)")],
        widget=forms.CheckboxSelectMultiple, initial=["tenant"], label="I want to")

    class Meta(UserCreationForm.Meta):
        fields = ["username"]

    def clean_organization(self):
        name = self.cleaned_data["organization"].strip()
        slug = slugify(name)[:64]
        if not slug:
            raise forms.ValidationError("Use some letters or digits.")
        if Organization.objects.filter(slug=slug).exists():
            raise forms.ValidationError("An organisation of this name exists already.")
        self.cleaned_data["organization_slug"] = slug
        return name


class DollarsField(forms.CharField):
    def to_python(self, value):
        value = super().to_python(value).strip().lstrip("$")
        if value in self.empty_values:
            return None
        try:
            micros = parse_dollars(value)
        except BadAmount as exc:
            raise forms.ValidationError(f"{exc}") from None
        if micros < 0:
            raise forms.ValidationError("An amount cannot be negative.")
        return micros


ALTERNATIVE_ROWS = 8
WITHIN_CHOICES = [("", "anywhere"), ("required:node", "one node"), ("required:leaf", "one leaf"),
                  ("required:spine", "one spine block"), ("preferred:node", "one node if it can"),
                  ("preferred:leaf", "one leaf if it can"),
                  ("preferred:spine", "one spine block if it can")]


class AlternativeForm(forms.Form):
    """One row of a bid over alternatives; a row left empty is no alternative (it is built
    with `empty_permitted`, so Django does not validate it)."""

    gpus = forms.IntegerField(required=False, min_value=1, max_value=100_000, label="GPUs")
    gpu_models = forms.CharField(required=False, max_length=400, label="GPU models",
                                 help_text="one, or several as H100-80GB|H200")
    within = forms.ChoiceField(required=False, choices=WITHIN_CHOICES, label="Keep within")
    hours = forms.IntegerField(required=False, min_value=1, max_value=8760, label="Hours")
    max_price = DollarsField(required=False, label="Limit per GPU-hour ($)")

    def clean_gpu_models(self) -> list[str]:
        text = self.cleaned_data["gpu_models"]
        names = [name.strip() for name in text.replace(",", "|").split("|")]
        if text and not all(names):
            raise forms.ValidationError("Name GPU models separated by |, e.g. H100-80GB|H200.")
        if len(names) > 10:
            raise forms.ValidationError("At most 10 GPU models.")
        return names if text else []

    def clean(self):
        data = super().clean()
        for name in ("gpus", "gpu_models", "hours", "max_price"):
            if name not in self.errors and data.get(name) in (None, []):
                self.add_error(name, "Give this, or leave the whole row empty.")
        return data

    def shape(self) -> dict:
        """The alternative as `market.orders` takes it."""
        data = self.cleaned_data
        kind, _, level = data["within"].partition(":")
        return {"gpu_models": data["gpu_models"], "gpus": data["gpus"], "hours": data["hours"],
                "max_price_micros": data["max_price"], "topology": {kind: level} if level else {}}


class OrderForm(forms.Form):
    """One shape (model, GPUs, hours, limit, locality), or a spot or reserved bid over the
    filled rows of `alternatives` (`alt-0-gpus` ... `alt-7-max_price`)."""

    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=100, required=False)
    gpu_model = forms.ModelChoiceField(queryset=GpuModel.objects.order_by("name"),
                                       to_field_name="name", label="GPU model",
                                       empty_label=None)
    gpus = forms.IntegerField(min_value=1, max_value=100_000, initial=8, label="GPUs",
                              required=False)
    hours = forms.IntegerField(min_value=1, max_value=8760, initial=1, label="Hours",
                               required=False)
    tier = forms.ChoiceField(choices=Lease.Tier.choices, initial=Lease.Tier.ON_DEMAND,
                             label="Tier")
    max_price = DollarsField(label="Limit per GPU-hour ($)", initial="3.00", required=False,
                             help_text="You never pay more than this per GPU-hour.")
    level = forms.ChoiceField(choices=LEVEL_CHOICES, required=False, label="Keep GPUs within")
    strict = forms.ChoiceField(choices=[("required", "required"), ("preferred", "preferred")],
                               initial="required", label="Locality is")
    whole_nodes = forms.BooleanField(required=False, label="Whole nodes only (slices of 8)")
    fill = forms.ChoiceField(choices=Order.Fill.choices, initial=Order.Fill.FILL_OR_KILL,
                             label="If it cannot fill now")
    allow_moves = forms.BooleanField(
        required=False, label="Allow planned moves",
        help_text="IBEX may move the lease to other GPUs (with notice) to drain a node or make "
                  "room; the tier sets the default: spot yes, others no.")
    start_earliest = forms.DateTimeField(required=False, label="Start no earlier than",
                                         widget=forms.DateTimeInput(attrs={"type":
                                                                           "datetime-local"}))
    start_latest = forms.DateTimeField(required=False, label="Start no later than",
                                       widget=forms.DateTimeInput(attrs={"type":
                                                                         "datetime-local"}))
    mig_profile = forms.CharField(
        required=False, max_length=20, label="MIG slices of profile",
        help_text="e.g. 1g.10gb: then GPUs counts slices, and the limit is per slice-hour")
    gpu_share = forms.IntegerField(
        required=False, min_value=1, max_value=999, label="Shares of (thousandths of a GPU)",
        help_text="e.g. 250: then GPUs counts shares, and the limit is per share-hour")
    bandwidth_class = forms.ChoiceField(
        choices=[(qos.GUARANTEED, "guaranteed: Gb/s per GPU reserved on its links"),
                 (qos.STANDARD, "standard: shares the links"),
                 (qos.SCAVENGER, "scavenger: what is left, last")],
        initial=qos.STANDARD, required=False, label="Bandwidth class")
    gbps_per_gpu = forms.DecimalField(
        required=False, min_value=0, max_digits=7, decimal_places=1,
        label="Guaranteed Gb/s per GPU", help_text="guaranteed class only, e.g. 50")

    def __init__(self, data=None, *args, **kwargs):
        super().__init__(data, *args, **kwargs)
        self.alternatives = [AlternativeForm(data, prefix=f"alt-{row}", empty_permitted=True,
                                             use_required_attribute=False)
                             for row in range(ALTERNATIVE_ROWS)]
        for row, alternative in enumerate(self.alternatives, start=1):
            # each field named for its row, so a screen reader (and a test) tells them apart
            for field in alternative.fields.values():
                field.label = f"Alternative {row}: {field.label}"

    def filled_alternatives(self) -> list[AlternativeForm]:
        return [row for row in self.alternatives if row.has_changed()]

    def clean(self):
        data = super().clean()
        filled = self.filled_alternatives()
        if not filled:
            for name in ("gpus", "hours", "max_price"):
                if name not in self.errors and data.get(name) is None:
                    self.add_error(name, "This field is required.")
        elif not all([row.is_valid() for row in filled]):
            self.add_error(None, forms.ValidationError(
                "An alternative has an error: see its row.", code="alternatives"))
        if data.get("mig_profile") and data.get("gpu_share"):
            self.add_error("gpu_share", "Slices or shares, not both.")
        if data.get("tier") == Lease.Tier.RESERVED:
            if not data.get("start_earliest"):
                self.add_error("start_earliest", "A reserved order needs a start window.")
            if not data.get("start_latest"):
                self.add_error("start_latest", "A reserved order needs a start window.")
        earliest, latest = data.get("start_earliest"), data.get("start_latest")
        if earliest and latest and latest < earliest:
            self.add_error("start_latest", "The window ends before it starts.")
        gbps = data.get("gbps_per_gpu")
        if data.get("bandwidth_class") == qos.GUARANTEED and "gbps_per_gpu" not in self.errors \
                and not gbps:
            self.add_error("gbps_per_gpu", "The guaranteed class needs Gb/s per GPU above 0.")
        elif data.get("bandwidth_class") not in (None, qos.GUARANTEED) and gbps is not None:
            self.add_error("gbps_per_gpu", "Only the guaranteed class takes Gb/s per GPU.")
        return data

    def add_order_error(self, field: str | None, message: str) -> None:
        """A refusal of `market.orders` next to the field it names: an alternative's
        (`alternatives.1.gpus`: the second filled row) in its row."""
        where, _, rest = (field or "").partition(".")
        if where == "alternatives" and rest:
            position, _, name = rest.partition(".")
            row = self.filled_alternatives()[int(position)]
            row.add_error(ALTERNATIVE_FIELDS.get(name, None), message)
            message = "An alternative has an error: see its row."
        if where == "alternatives":
            self.add_error(None, forms.ValidationError(message, code="alternatives"))
        else:
            self.add_error(ORDER_FIELDS.get(field) if field else None, message)

    def alternatives_open(self) -> bool:
        """Show the rows: some are filled (or refused)."""
        return self.is_bound and bool(self.filled_alternatives() or self.alternatives_errors())

    def alternatives_errors(self) -> list[str]:
        return [m for e in self.errors.as_data().get("__all__", []) if e.code == "alternatives"
                for m in e.messages]

    def other_errors(self) -> list[str]:
        return [m for e in self.errors.as_data().get("__all__", []) if e.code != "alternatives"
                for m in e.messages]

    def topology(self) -> dict:
        data, topology = self.cleaned_data, {}
        if data.get("level"):
            topology[data["strict"]] = data["level"]
        if data.get("whole_nodes"):
            topology["whole_nodes"] = True
        return topology


# OrderError.field (the API's names) → the form field that shows the message
ORDER_FIELDS = {"gpu_models": "gpu_model", "gpus": "gpus", "hours": "hours",
                "mig_profile": "mig_profile", "gpu_share": "gpu_share", "pool": None,
                "max_price_per_gpu_hour": "max_price", "topology": "level",
                "start_window": "start_earliest", "fill": "fill", "tier": "tier",
                "bandwidth.class": "bandwidth_class", "bandwidth.gbps_per_gpu": "gbps_per_gpu"}
# ... and an alternative's (alternatives.N.FIELD) → the field of its row
ALTERNATIVE_FIELDS = {"gpu_models": "gpu_models", "gpus": "gpus", "hours": "hours",
                      "max_price_per_gpu_hour": "max_price", "topology": "within"}


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, label="Name",
                           help_text="Where the key is used, e.g. “training cluster CI”.")
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in ApiKey.Scope.values], initial=["read", "trade"],
        widget=forms.CheckboxSelectMultiple, label="Scopes")


SCOPE_KINDS = [("fabric", "a whole fabric"), ("gpu_model", "a GPU model"), ("leaf", "a leaf"),
               ("node", "a node (hostname)")]


class PriceForm(forms.Form):
    scope_kind = forms.ChoiceField(choices=SCOPE_KINDS, label="Price")
    scope_value = forms.CharField(max_length=200, label="Named",
                                  help_text="Fabric name, GPU model, leaf or hostname.")
    price = DollarsField(label="Price per GPU-hour ($)")
    min_lease_hours = forms.IntegerField(min_value=1, max_value=8760, initial=1,
                                         label="Minimum lease (hours)")

    def clean_price(self):
        micros = self.cleaned_data["price"]
        if micros is None:
            raise forms.ValidationError("Enter a price.")
        if micros > 1_000 * 1_000_000:
            raise forms.ValidationError("At most $1,000.00 per GPU-hour.")
        return micros


class FabricImportForm(forms.Form):
    """A fabric file from the provider's subnet manager or Slurm (fabric.services)."""

    name = forms.SlugField(max_length=100, label="Fabric name",
                           help_text="Importing a name again updates that fabric.")
    format = forms.ChoiceField(choices=[("ibnetdiscover", "ibnetdiscover output"),
                                        ("slurm", "Slurm topology.conf")])
    gpus_per_node = forms.IntegerField(min_value=0, max_value=64, initial=8,
                                       label="GPUs per node")
    file = forms.FileField(label="File")

    def clean_file(self):
        upload = self.cleaned_data["file"]
        if upload.size > MAX_UPLOAD_BYTES:
            raise forms.ValidationError(f"The file is larger than {MAX_UPLOAD_BYTES:,} bytes.")
        try:
            return upload.read().decode("utf-8"), upload.name
        except UnicodeDecodeError:
            raise forms.ValidationError("The file is not UTF-8 text.") from None


class PoolOrderForm(forms.Form):
    """An order in a private pool: priced in quota, so no price, tier or fill; the quota
    decides when it starts (`market.pool_orders`)."""

    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=100, required=False)
    pool = forms.ChoiceField(label="Pool")
    queue = forms.ChoiceField(label="Queue")
    gpu_model = forms.ChoiceField(label="GPU model")
    gpus = forms.IntegerField(min_value=1, max_value=100_000, initial=8, label="GPUs")
    hours = forms.IntegerField(min_value=1, max_value=8760, initial=4, label="Hours")
    priority = forms.IntegerField(min_value=0, max_value=1000, initial=0, label="Priority",
                                  help_text="0–1000: higher is admitted first within your "
                                            "queue.")
    priority_class = forms.ChoiceField(required=False, label="or a priority class",
                                       help_text="The pool's named priorities; one chosen "
                                                 "replaces the number.")

    def __init__(self, *args, queues=(), **kwargs):
        """`queues`: the organisation's quota queues (`pool.QuotaNode` leaves with quotas)."""
        super().__init__(*args, **kwargs)
        queues = list(queues)
        self.fields["pool"].choices = sorted({(q.pool.name, q.pool.name) for q in queues})
        self.fields["queue"].choices = sorted({(q.name, q.name) for q in queues})
        models = sorted({quota.gpu_model.name for q in queues for quota in q.quotas.all()})
        self.fields["gpu_model"].choices = [(m, m) for m in models]

        classes = PriorityClass.objects.filter(pool__in={q.pool_id for q in queues})
        self.fields["priority_class"].choices = [("", "none")] + [
            (c.name, f"{c.name} ({c.value})") for c in classes.order_by("-value", "name")
            .distinct("value", "name")]


# OrderError.field of a pool order → the form field that shows the message
POOL_ORDER_FIELDS = {"pool": "pool", "queue": "queue", "gpu_models": "gpu_model",
                     "gpus": "gpus", "hours": "hours", "priority": "priority",
                     "priority_class": "priority_class"}
