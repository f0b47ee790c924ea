# movielens.R — writes dslabs::movielens as CSV (called by scripts/movielens.sh). Usage: Rscript movielens.R OUT
args <- commandArgs(trailingOnly = TRUE)
suppressPackageStartupMessages(library(dslabs))
data("movielens", package = "dslabs")
m <- movielens
m$genres <- as.character(m$genres)
m$year[is.na(m$year)] <- 0
write.csv(m[, c("userId", "movieId", "rating", "timestamp", "year", "genres")], file = args[1], row.names = FALSE)
