/* The preemption countdown on a lease page, ticking between the page's 5-second refreshes:
   every element with data-deadline="ISO time" shows the time left. */
setInterval(function () {
  document.querySelectorAll("[data-deadline]").forEach(function (el) {
    var s = Math.floor((Date.parse(el.dataset.deadline) - Date.now()) / 1000);
    if (s <= 0) { el.textContent = "now"; return; }
    var h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), r = s % 60, p = function (n) { return (n < 10 ? "0" : "") + n; };
    el.textContent = (h ? h + " h " + p(m) + " min " : m + " min ") + p(r) + " s";
  });
}, 1000);
