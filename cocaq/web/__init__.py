"""The web app: a user's own footprint in the browser, as an Open OnDemand Passenger app (ood/) or behind
a reverse proxy (`cocaq web`). Pages in `pages`, WSGI plumbing in `app`, where the figures come from in
`reader`, templates and downloads in `render`; `wsgi.application` is what a WSGI server loads."""
