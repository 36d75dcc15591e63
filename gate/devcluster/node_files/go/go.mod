module nodegate.local/node

go 1.25.0
