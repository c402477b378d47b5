/* A minimal Stripe.js for tests, served by the fake Stripe at /v3/: the card element and
   confirmCardPayment, talking to the fake's API with the publishable key as Stripe.js does. */
(function () {
  "use strict";
  var base = new URL(document.currentScript.src).origin;

  function field(name, label, placeholder, size) {
    var input = document.createElement("input");
    input.type = "text";
    input.name = name;
    input.inputMode = "numeric";
    input.autocomplete = "off";
    input.placeholder = placeholder;
    input.size = size;
    input.setAttribute("aria-label", label);
    input.className = "fake-stripe-" + name;
    return input;
  }

  function CardElement() {
    this.inputs = {
      number: field("cardnumber", "Card number", "1234 1234 1234 1234", 19),
      exp: field("exp-date", "Expiry date (MM / YY)", "MM / YY", 7),
      cvc: field("cvc", "Security code (CVC)", "CVC", 4)
    };
    this.handlers = {};
  }
  CardElement.prototype.mount = function (target) {
    var host = typeof target === "string" ? document.querySelector(target) : target;
    var self = this;
    host.textContent = "";
    host.classList.add("fake-stripe-card");
    Object.keys(this.inputs).forEach(function (key) {
      var input = self.inputs[key];
      input.addEventListener("focus", function () { (self.handlers.focus || []).forEach(function (h) { h(); }); });
      input.addEventListener("blur", function () { (self.handlers.blur || []).forEach(function (h) { h(); }); });
      host.appendChild(input);
    });
  };
  CardElement.prototype.on = function (event, handler) {
    (this.handlers[event] = this.handlers[event] || []).push(handler);
  };
  CardElement.prototype.focus = function () { this.inputs.number.focus(); };

  function form(params, prefix, out) {
    Object.keys(params).forEach(function (key) {
      var name = prefix ? prefix + "[" + key + "]" : key;
      var value = params[key];
      if (value !== null && typeof value === "object") { form(value, name, out); }
      else { out.push(encodeURIComponent(name) + "=" + encodeURIComponent(value)); }
    });
    return out;
  }

  function Stripe(publishableKey) {
    if (!(this instanceof Stripe)) { return new Stripe(publishableKey); }
    this.key = publishableKey;
  }
  Stripe.prototype.elements = function () {
    return { create: function (type) {
      if (type !== "card") { throw new Error("the fake Stripe.js makes card elements only"); }
      return new CardElement();
    } };
  };
  Stripe.prototype.confirmCardPayment = function (clientSecret, data) {
    var card = data && data.payment_method && data.payment_method.card;
    var intentId = clientSecret.split("_secret_")[0];
    var body = form({
      client_secret: clientSecret,
      payment_method: { card: {
        number: card ? card.inputs.number.value : "",
        exp: card ? card.inputs.exp.value : "",
        cvc: card ? card.inputs.cvc.value : ""
      } }
    }, "", []).join("&");
    return fetch(base + "/v1/payment_intents/" + intentId + "/confirm", {
      method: "POST",
      headers: { "Authorization": "Bearer " + this.key,
                 "Content-Type": "application/x-www-form-urlencoded" },
      body: body
    }).then(function (response) {
      return response.json().then(function (answer) {
        return answer.error ? { error: answer.error } : { paymentIntent: answer };
      });
    });
  };
  window.Stripe = Stripe;
})();
