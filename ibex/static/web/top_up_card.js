/* The top-up page's card element: Stripe.js (loaded by the page only where it is configured)
   mounts the card field; the form confirms the PaymentIntent in the browser, then the page
   asks IBEX until Stripe's webhook has credited the balance. No inline script: CSP-safe. */
(function () {
  "use strict";

  function mount(root) {
    var form = root.id === "card-form" ? root : root.querySelector && root.querySelector("#card-form");
    if (!form || form.dataset.mounted) { return; }
    var errors = form.querySelector("#card-errors");
    var button = form.querySelector("button[type=submit]");
    var field = form.querySelector("#card-element");
    if (typeof window.Stripe !== "function") {
      errors.textContent = "Card payments are unavailable right now: Stripe.js did not load.";
      button.disabled = true;
      return;
    }
    form.dataset.mounted = "yes";
    var stripe = window.Stripe(form.dataset.publishableKey);
    var card = stripe.elements().create("card");
    card.mount(field);
    card.on("focus", function () { field.classList.add("focused"); });
    card.on("blur", function () { field.classList.remove("focused"); });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      errors.textContent = "";
      button.disabled = true;
      button.textContent = "Paying…";
      stripe.confirmCardPayment(form.dataset.clientSecret, { payment_method: { card: card } })
        .then(function (result) {
          if (result.error) {
            errors.textContent = result.error.message || "The card was not accepted.";
            button.disabled = false;
            button.textContent = form.dataset.payLabel;
            return;
          }
          window.htmx.ajax("GET", form.dataset.statusUrl + "?confirmed=1",
                           { target: "#top-up", swap: "outerHTML" });
        }, function () {
          errors.textContent = "Stripe could not be reached; nothing was charged. Try again.";
          button.disabled = false;
          button.textContent = form.dataset.payLabel;
        });
    });
  }

  // a card form swapped in by the status poll, and one already on the page when it loads
  // (mounting twice is a no-op)
  if (window.htmx) { window.htmx.onLoad(mount); }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { mount(document.body); });
  } else {
    mount(document.body);
  }
})();
