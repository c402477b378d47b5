"""The server-rendered marketplace, provider and operator pages: thin views that call the apps'
services and selectors. It is the top of the import arrows: it may import every app, and
nothing imports it (the URLs name it as a string)."""
